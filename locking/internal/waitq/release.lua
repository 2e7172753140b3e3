-- Delete the lock if this owner holds it, drop a waiter that gives up, and,
-- if asked and the lock is free, wake the first live waiter: it keeps its
-- place in the queue until its try takes the lock (see acquire.lua).
-- KEYS[1] lock key, KEYS[2] queue, KEYS[3] liveness (see acquire.lua).
-- ARGV[1] owner, ARGV[2] wake channel prefix (the waiter's Locker id
-- completes it), ARGV[3] the member of a waiter that gives up, or '',
-- ARGV[4] '1' to wake the first waiter, ARGV[5] 's' to wake with SPUBLISH
-- (see wake), or absent.
-- Returns 1 if released, 0 if not held (expired, or someone else's now).
-- A waiter that gives up leaves the queue and passes the wake-up on: it may
-- have been the one woken for the last release.
local held = redis.call('get', KEYS[1]) == ARGV[1]
if ARGV[3] ~= '' then
	redis.call('zrem', KEYS[2], ARGV[3])
	redis.call('zrem', KEYS[3], ARGV[3])
end
if held then
	redis.call('del', KEYS[1])
end
if ARGV[4] == '1' and redis.call('exists', KEYS[1]) == 0 then
	purge(now())
	local head = redis.call('zrange', KEYS[2], 0, 0)[1]
	if head then
		wake(ARGV[2], head, ARGV[5])
	end
end
if held then
	return 1
end
return 0
