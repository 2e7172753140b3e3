-- Take the lock if it is free, and count its fence: the counter's new
-- value is the lease's token, greater than every earlier grant's.
-- KEYS[1] lock, KEYS[2] fence counter; ARGV[1] owner, ARGV[2] ttl in ms.
-- Returns {1, token}, or {0, the holder's remaining ms, the holder's owner}.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return {1, redis.call('incr', KEYS[2])}
end
return {0, redis.call('pttl', KEYS[1]), redis.call('get', KEYS[1]) or ''}
