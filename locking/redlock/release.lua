-- Delete the lock on this node if this owner holds it, drop a member from
-- the queue of waiters, and, if asked and the lock is free here, wake the
-- first waiter in the queue, skipping entries that expired (dead waiters).
-- Every try pushes its waiter's deadline back, so the first one is the
-- waiter that tried least recently; the nodes see the tries in about the
-- same order, so they mostly wake the same waiter.
-- KEYS[1] lock key, KEYS[2] waiters; ARGV[1] owner, ARGV[2] wake channel
-- prefix (the waiter's Locker id completes it), ARGV[3] member to drop or
-- '', ARGV[4] '1' to wake a waiter.
-- Returns 1 if released, 0 if not held (expired, or someone else's now).
local held = redis.call('get', KEYS[1]) == ARGV[1]
if ARGV[3] ~= '' then
	redis.call('zrem', KEYS[2], ARGV[3])
end
if held then
	redis.call('del', KEYS[1])
end
if ARGV[4] == '1' and redis.call('exists', KEYS[1]) == 0 then
	local t = redis.call('time')
	local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call('zremrangebyscore', KEYS[2], '-inf', now)
	local head = redis.call('zrange', KEYS[2], 0, 0)[1]
	if head then
		redis.call('zrem', KEYS[2], head)
		redis.call('publish', ARGV[2] .. string.match(head, '^[^:]*'), head)
	end
end
if held then
	return 1
end
return 0
