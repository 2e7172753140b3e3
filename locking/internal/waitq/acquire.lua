-- Take the lock if it is free and no live waiter is ahead of the caller;
-- else queue the caller, keeping the place it already has.
-- KEYS[1] lock key, KEYS[2] queue (sorted set: member -> place, the time of
-- first arrival in µs), KEYS[3] liveness (sorted set: member -> deadline in server
-- ms), KEYS[4] fence counter, or absent (no token), all in one hash slot.
-- ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] waiter member, ARGV[4] how long
-- the waiter stays live without a new try, in ms, ARGV[5] its place if the
-- caller chooses it (Redlock: the same on every node), '' for the server's
-- time, ARGV[6] wake channel prefix (a member's Locker id completes it),
-- ARGV[7] 'keep' to keep the place the caller had when granted here
-- (Redlock: a grant on one node is not yet a grant; the release takes the
-- place out), else ''; ARGV[8] 's' to wake with SPUBLISH (see wake), or
-- absent; ARGV[9] 'g' if releases hand the lock to the first waiter
-- (release.lua), else '' or absent: then a lock that holds the caller's
-- owner was handed to it, and is its lock (its TTL renewed, its token the
-- counter's value), and a refusal carries the counter's value; ARGV[10]
-- 't' (Redlock) to refuse, without queueing, an owner or member a release
-- ended here (its tombstone, see gone), else absent.
-- Returns {1, token (0 without a counter)} when granted, else
-- {0, ms to wait at most, holder's owner or ''[, the fence counter, the
-- waiters ahead with 'g']}: the holder's remaining TTL, or, when the lock
-- is free but a live waiter is first, the time until that waiter's place
-- expires if it never comes.
-- Order and liveness are kept apart: a woken waiter keeps its place while
-- it makes the round trip, and a newcomer that finds the lock free then
-- queues behind it instead of taking it (fair handoff). A waiter that stops
-- trying (dead, or it gave up and could not say so) loses its place when
-- its liveness deadline passes.
-- A late request of an attempt or wait already ended here: its undo or
-- leave, sent on another connection once this request had timed out, got
-- here first (a network can reorder two connections). Taking the key or a
-- place now would leave it behind for a TTL.
if ARGV[10] == 't' and (gone(ARGV[1]) or gone(ARGV[3])) then
	return {0, 0, ''}
end
-- Nobody queued: a free lock is the caller's at once, with nothing to
-- keep (the uncontended path, as cheap as a plain SET NX).
if redis.call('exists', KEYS[2]) == 0 and redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	if KEYS[4] then
		return {1, redis.call('incr', KEYS[4])}
	end
	return {1, 0}
end
-- Handed to the caller by a release whose wake-up it has not heard (yet):
-- no grant since set the counter, so its value is this lease's token.
local handoff = ARGV[9] == 'g'
if handoff and redis.call('get', KEYS[1]) == ARGV[1] then
	redis.call('pexpire', KEYS[1], ARGV[2])
	return {1, tonumber(redis.call('get', KEYS[4]) or '0')}
end
local ms, t = now()
local dead = purge(ms)
local life = tonumber(ARGV[4])
-- Queue the caller first (a place it has is kept), then look at the head:
-- a caller whose place puts it first takes a free lock in this call.
-- A place the caller chose is kept as it is within [now - 10 life, now +
-- life] of this server's clock: every node of a Redlock must store the same
-- place, or nodes order waiters by their own arrival times and each waiter
-- heads a different node for good (a split vote no retry ends). Only a
-- client clock off by more than that is clamped: it can put its waiters
-- behind others, or ahead of them, by at most that window.
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local place = us
if ARGV[5] ~= '' then
	place = math.min(math.max(tonumber(ARGV[5]), us - 10 * life * 1000), us + life * 1000)
end
local added = redis.call('zadd', KEYS[2], 'NX', place, ARGV[3])
redis.call('zadd', KEYS[3], ms + life, ARGV[3])
for i = 2, 3 do
	if redis.call('pttl', KEYS[i]) < life then
		redis.call('pexpire', KEYS[i], life)
	end
end
local head = redis.call('zrange', KEYS[2], 0, 0)[1]
if head == ARGV[3] and redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	-- 'keep' keeps a place the caller had before this call; one it got
	-- only now it would not have had without the grant.
	if ARGV[7] ~= 'keep' or added == 1 then
		redis.call('zrem', KEYS[2], head)
		redis.call('zrem', KEYS[3], head)
	end
	if KEYS[4] then
		return {1, redis.call('incr', KEYS[4])}
	end
	return {1, 0}
end
-- A refusal; with direct handoff it carries the fence counter and the
-- number of waiters ahead of the caller.
local function refuse(wait, holder)
	if handoff then
		return {0, wait, holder, tonumber(redis.call('get', KEYS[4]) or '0'), redis.call('zrank', KEYS[2], ARGV[3]) or 0}
	end
	return {0, wait, holder}
end
local holder = redis.call('get', KEYS[1])
if holder then
	return refuse(redis.call('pttl', KEYS[1]), holder)
end
-- Free, and a live waiter is first. If it only now became first (the ones
-- ahead of it died), nobody has told it yet.
if dead > 0 then
	wake(ARGV[6], head, ARGV[8])
end
local deadline = redis.call('zscore', KEYS[3], head)
if not deadline then
	-- Queued without liveness (the two sets diverged): not live.
	redis.call('zrem', KEYS[2], head)
	return refuse(0, '')
end
return refuse(deadline - ms, '')
