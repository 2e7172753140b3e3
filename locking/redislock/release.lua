-- Delete the lock if this owner holds it, and hand the freed lock to one
-- waiter: the one queued first, skipping entries that expired (dead waiters).
-- KEYS[1] lock key, KEYS[2] waiters (see acquire.lua).
-- ARGV[1] owner, ARGV[2] wake channel prefix (the waiter's Locker id
-- completes it), ARGV[3] the member of a waiter that gives up, or ''.
-- Returns 1 if released, 0 if not held (expired, or someone else's now).
-- A waiter that gives up leaves the queue, and passes the wake-up on if the
-- lock is free: it may have been the one woken for the last release.
local held = redis.call('get', KEYS[1]) == ARGV[1]
if ARGV[3] ~= '' then
	redis.call('zrem', KEYS[2], ARGV[3])
end
if held then
	redis.call('del', KEYS[1])
elseif ARGV[3] == '' or redis.call('exists', KEYS[1]) == 1 then
	return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[2], '-inf', now)
local head = redis.call('zrange', KEYS[2], 0, 0)[1]
if head then
	redis.call('zrem', KEYS[2], head)
	redis.call('publish', ARGV[2] .. string.match(head, '^[^:]*'), head)
end
if held then
	return 1
end
return 0
