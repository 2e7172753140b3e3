-- Delete the lock only if this owner holds it, and wake the waiters.
-- KEYS[1] lock key; ARGV[1] owner, ARGV[2] release channel.
-- Returns 1 if released, 0 if not held (expired, or someone else's now).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], 'released')
return 1
