-- Shared by acquire.lua and release.lua (prepended to each).
-- now is the server's time in ms; purge drops up to 100 entries whose
-- deadline has passed from the liveness KEYS[3] (waiters, and tombstones:
-- see gone) and those waiters from the queue KEYS[2], and returns how many
-- waiters left the queue.
local function now()
	local t = redis.call('time')
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
local function purge(ms)
	local dead = redis.call('zrangebyscore', KEYS[3], '-inf', ms, 'LIMIT', 0, 100)
	if #dead == 0 then
		return 0
	end
	redis.call('zrem', KEYS[3], unpack(dead))
	return redis.call('zrem', KEYS[2], unpack(dead))
end
-- A tombstone (Redlock) says that a release ended an owner or a member on
-- this server: "gone:<name>" in the liveness KEYS[3], its score the time it
-- lapses. gone tells whether name has one in force; bury gives owner and
-- member (if not '') one for ms.
local function gone(name)
	local deadline = redis.call('zscore', KEYS[3], 'gone:' .. name)
	return deadline and tonumber(deadline) > now()
end
local function bury(owner, member, ms)
	local deadline = now() + ms
	redis.call('zadd', KEYS[3], deadline, 'gone:' .. owner)
	if member ~= '' then
		redis.call('zadd', KEYS[3], deadline, 'gone:' .. member)
	end
	if redis.call('pttl', KEYS[3]) < ms then
		redis.call('pexpire', KEYS[3], ms)
	end
end
-- wake tells member, by name, on its Locker's channel (prefix + Locker id),
-- with SPUBLISH if sharded is 's' (Redis Cluster: the message stays in the
-- shard of the lock's slot, which the channel's hash tag shares), else
-- PUBLISH. The message is the member, then, if grant is given, a space
-- and grant (the token of a lock handed to the member, a space and the
-- key's PX in ms).
local function wake(prefix, member, sharded, grant)
	local cmd = 'publish'
	if sharded == 's' then
		cmd = 'spublish'
	end
	local msg = member
	if grant then
		msg = member .. ' ' .. grant
	end
	redis.call(cmd, prefix .. string.match(member, '^[^:]*'), msg)
end
