-- Grant the lock if it is free, with the next fencing token.
-- KEYS[1] lock key, KEYS[2] fence counter (same hash slot); ARGV[1] owner, ARGV[2] ttl in ms.
-- Returns {1, token} when granted, {0, pttl of the holder} when not.
-- SET and INCR run in one script, so no grant goes without its token and the
-- token order is the grant order. The counter never expires: tokens keep
-- growing across holders, expiries and restarts that keep the data.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return {1, redis.call('incr', KEYS[2])}
end
return {0, redis.call('pttl', KEYS[1])}
