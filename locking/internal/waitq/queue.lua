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
-- wake tells member, by name, on its Locker's channel (prefix + Locker id).
local function wake(prefix, member)
	redis.call('publish', prefix .. string.match(member, '^[^:]*'), member)
end
