-- Grant the lock if it is free, with the next fencing token; else queue the
-- caller as a waiter.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] waiters (a sorted set:
-- member -> deadline in server ms), all in one hash slot.
-- ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] waiter member, ARGV[4] how long
-- the waiter's entry lives without a new try, in ms.
-- Returns {1, token} when granted, {0, pttl of the holder} when not.
-- SET and INCR run in one script, so no grant goes without its token and the
-- token order is the grant order. The counter never expires: tokens keep
-- growing across holders, expiries and restarts that keep the data.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	redis.call('zrem', KEYS[3], ARGV[3])
	return {1, redis.call('incr', KEYS[2])}
end
-- Queued by its deadline: the waiter that tried least recently comes first,
-- and the entries of waiters that stopped trying (dead) expire first.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[4])
redis.call('zadd', KEYS[3], now + life, ARGV[3])
if redis.call('pttl', KEYS[3]) < life then
	redis.call('pexpire', KEYS[3], life)
end
return {0, redis.call('pttl', KEYS[1])}
