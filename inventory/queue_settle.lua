-- Settle queued orders of one SKU once MySQL has their outcome: confirmed
-- (mode done: the take is spent) or rejected (mode back: the quantity goes
-- back to the counter). Each entry is then acknowledged and deleted, so
-- the stream holds only what is not settled yet.
-- KEYS[1]: the stream; KEYS[2]: the queued hash; KEYS[3]: the SKU's
-- counter; KEYS[4]: the gate's key set; KEYS[5]: the orders taken again
-- (below); KEYS[6..]: the markers of the orders that have a key, in order.
-- ARGV[1]: the consumer group; ARGV[2]: how long a marker outlives its
-- order (ms); then six per order: entry id, order id, mode, quantity,
-- Idempotency-Key ('' for none), the counter's epoch at the accept ('' if
-- unknown).
-- Only the first settle of an order moves the counter (its id leaves the
-- queued hash then), so a redelivered entry settled twice counts once.
-- An order not in the hash whose epoch is not the counter's was taken
-- from a counter its Redis lost with its data (a restart without
-- persistence): the counter was seeded again from MySQL, which did not
-- hold the order yet if it committed after that, so a confirmed one is
-- taken again (as gate_settle.lua's done), once however many consumers
-- settle it (two may hold an entry claimed before the loss; a settle may
-- be sent again). If it committed before the seed read MySQL, that takes
-- it twice, as the flow's done does: the counter is short until the
-- reconciler sets it once nothing is in flight (under guard none, which
-- reconciles nothing, until a PUT).
-- Every keyed order's key goes into the key set: MySQL holds it now,
-- confirmed or rejected, and an order accepted before the gate's Redis
-- lost its data may be written after the set was loaded again.
-- Returns how many orders were still queued.
local m, n = 6, 0
local exists = redis.call('EXISTS', KEYS[3]) == 1
for i = 3, #ARGV, 6 do
  local q = tonumber(ARGV[i + 3])
  if redis.call('HDEL', KEYS[2], ARGV[i + 1]) == 1 then
    n = n + 1
    if exists then
      redis.call('HINCRBY', KEYS[3], 'held', -q)
      if ARGV[i + 2] == 'back' then
        redis.call('HINCRBY', KEYS[3], 'stock', q)
      end
      redis.call('HINCRBY', KEYS[3], 'seq', 1)
    end
  elseif exists and ARGV[i + 2] == 'done' and ARGV[i + 5] ~= '' and
      redis.call('HGET', KEYS[3], 'epoch') ~= ARGV[i + 5] and
      redis.call('SADD', KEYS[5], ARGV[i + 1]) == 1 then
    redis.call('PEXPIRE', KEYS[5], 3600000)
    redis.call('HINCRBY', KEYS[3], 'stock', -q)
    redis.call('HINCRBY', KEYS[3], 'seq', 1)
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
