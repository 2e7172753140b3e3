-- Shared by acquire.lua and release.lua (prepended to each).
-- now is the server's time in ms; purge drops up to 100 waiters whose
-- liveness deadline has passed from the queue KEYS[2] and liveness KEYS[3].
local function now()
	local t = redis.call('time')
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
local function purge(ms)
	local dead = redis.call('zrangebyscore', KEYS[3], '-inf', ms, 'LIMIT', 0, 100)
	if #dead > 0 then
		redis.call('zrem', KEYS[2], unpack(dead))
		redis.call('zrem', KEYS[3], unpack(dead))
	end
	return #dead
end
-- wake tells member, by name, on its Locker's channel (prefix + Locker id),
-- with SPUBLISH if sharded is 's' (Redis Cluster: the message stays in the
-- shard of the lock's slot, which the channel's hash tag shares), else
-- PUBLISH. The message is the member, then, if grant is given, a space
-- and grant (the token of a lock handed to the member).
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
