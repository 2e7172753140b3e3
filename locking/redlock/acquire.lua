-- Take the lock on this node if it is free; else queue the caller as a
-- waiter (see release.lua).
-- KEYS[1] lock key, KEYS[2] waiters (a sorted set: member -> deadline in
-- this node's ms); ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] waiter member,
-- ARGV[4] how long the entry lives without a new try, in ms.
-- Returns {1} when set, {0, pttl, owner} of the holder when not: the owner
-- tells a split vote (no one has a majority) from a lock that is held.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	redis.call('zrem', KEYS[2], ARGV[3])
	return {1}
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[4])
redis.call('zadd', KEYS[2], now + life, ARGV[3])
if redis.call('pttl', KEYS[2]) < life then
	redis.call('pexpire', KEYS[2], life)
end
return {0, redis.call('pttl', KEYS[1]), redis.call('get', KEYS[1])}
