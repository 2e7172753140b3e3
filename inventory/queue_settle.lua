-- Settle queued orders of one SKU once MySQL has their outcome: confirmed
-- or refused for lack of stock (mode done: the take is spent) or rejected
-- otherwise (mode back: the quantity goes back to the counter). Each entry is then acknowledged and deleted, so
-- the stream holds only what is not settled yet.
-- KEYS[1]: the stream; KEYS[2]: the queued hash; KEYS[3]: the SKU's
-- counter; KEYS[4]: the gate's key set; KEYS[5..]: the markers of the
-- orders that have a key, in order.
-- ARGV[1]: the consumer group; ARGV[2]: how long a marker outlives its
-- order (ms); then five per order: entry id, order id, mode, quantity,
-- Idempotency-Key ('' for none).
-- Only the first settle of an order moves the counter (its id leaves the
-- queued hash then), so a redelivered entry settled twice counts once.
-- Every keyed order's key goes into the key set: MySQL holds it now,
-- confirmed or rejected, and an order accepted before the gate's Redis
-- lost its data may be written after the set was loaded again.
-- Returns how many orders were still queued.
local m, n = 5, 0
for i = 3, #ARGV, 5 do
  local q = tonumber(ARGV[i + 3])
  if redis.call('HDEL', KEYS[2], ARGV[i + 1]) == 1 then
    n = n + 1
    if redis.call('EXISTS', KEYS[3]) == 1 then
      redis.call('HINCRBY', KEYS[3], 'held', -q)
      if ARGV[i + 2] == 'back' then
        redis.call('HINCRBY', KEYS[3], 'stock', q)
      end
      redis.call('HINCRBY', KEYS[3], 'seq', 1)
    end
  end
  if ARGV[i + 4] ~= '' then
    redis.call('SADD', KEYS[4], ARGV[i + 4])
    redis.call('PEXPIRE', KEYS[m], ARGV[2])
    m = m + 1
  end
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
  redis.call('XDEL', KEYS[1], ARGV[i])
end
return n
