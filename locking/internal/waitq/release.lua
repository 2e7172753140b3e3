-- Delete the lock if this owner holds it, drop a waiter that gives up, and,
-- if asked and the lock is free, wake the first live waiter: it keeps its
-- place in the queue until its try takes the lock (see acquire.lua); or,
-- with 'g', hand it the lock (direct handoff): set the key to its owner,
-- take it out of the queue and tell it the token in the wake-up, which
-- makes it the holder without another round trip.
-- A waiter that takes handoffs names its member '<locker id>:<owner>:<px>'
-- (HandoffMember): the handed key lives px ms, the waiter's choice, not
-- the releaser's TTL (Lockers may differ), and the wake-up states it. A
-- waiter of another kind ('<locker id>:<owner>') is only woken.
-- KEYS[1] lock key, KEYS[2] queue, KEYS[3] liveness (see acquire.lua),
-- KEYS[4] fence counter (needed by 'g').
-- ARGV[1] owner, ARGV[2] wake channel prefix (the waiter's Locker id
-- completes it), ARGV[3] the member of a waiter that gives up, or '',
-- ARGV[4] '1' to wake the first waiter, 'g' to hand it the lock, ARGV[5]
-- 's' to wake with SPUBLISH (see wake), or absent; ARGV[6] ttl in ms
-- (needed by 't'); ARGV[7] 't' (Redlock) to leave tombstones for
-- the owner and the member for ttl (see gone), so that a late acquire of
-- theirs is refused here, else absent.
-- Returns 1 if released, 0 if not held (expired, or someone else's now).
-- A waiter that gives up leaves the queue and passes the wake-up (or the
-- lock, if it was handed the lock it no longer wants) on.
local held = redis.call('get', KEYS[1]) == ARGV[1]
if ARGV[3] ~= '' then
	redis.call('zrem', KEYS[2], ARGV[3])
	redis.call('zrem', KEYS[3], ARGV[3])
end
if held then
	redis.call('del', KEYS[1])
end
if ARGV[7] == 't' then
	bury(ARGV[1], ARGV[3], tonumber(ARGV[6]))
end
-- Nobody queued (the queue goes with its last entry): nobody to wake.
if (ARGV[4] == '1' or ARGV[4] == 'g') and redis.call('exists', KEYS[2]) == 1 and redis.call('exists', KEYS[1]) == 0 then
	local ms = now()
	purge(ms)
	local head = redis.call('zrange', KEYS[2], 0, 0)[1]
	local live = head and tonumber(redis.call('zscore', KEYS[3], head) or '0') > ms
	local owner, px
	if live and ARGV[4] == 'g' then
		owner, px = string.match(head, '^[^:]*:([^:]*):(%d+)$')
	end
	if owner then
		-- The head is live: it tried within its life, and a waiter that
		-- gives up leaves the queue first. If it died since, the key
		-- lapses after px (the waiter bounds it by its queue life), not
		-- after a whole TTL.
		redis.call('set', KEYS[1], owner, 'PX', px)
		redis.call('zrem', KEYS[2], head)
		redis.call('zrem', KEYS[3], head)
		wake(ARGV[2], head, ARGV[5], redis.call('incr', KEYS[4]) .. ' ' .. px)
	elseif head then
		wake(ARGV[2], head, ARGV[5])
	end
end
if held then
	return 1
end
return 0
