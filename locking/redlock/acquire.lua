-- Take the lock on this node if it is free.
-- KEYS[1] lock key; ARGV[1] owner, ARGV[2] ttl in ms.
-- Returns {1} when set, {0, pttl, owner} of the holder when not: the owner
-- tells a split vote (no one has a majority) from a lock that is held.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return {1}
end
return {0, redis.call('pttl', KEYS[1]), redis.call('get', KEYS[1])}
