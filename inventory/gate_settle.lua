-- Settle a take: its order committed (mode done) or will not (mode back).
-- KEYS[1]: the pending hash; KEYS[2]: the due sorted set; KEYS[3]: the
-- gate's key set; KEYS[4..]: the lines' counters. ARGV[1]: tag ("" for a
-- give-back that was never pending: a cancelled or expired hold); ARGV[2]:
-- mode; ARGV[3]: the entry the caller saw ("" = any: a back-check must not
-- settle a later take of the same tag); ARGV[4]: the take's
-- Idempotency-Key ('' for none); ARGV[5..]: the quantities.
-- Only the first settle of a tag counts, so the flow and a back-check on
-- another replica never give one take back twice. A done whose entry a
-- back-check already gave back takes the quantity again: the order did
-- commit. A done adds the key to the key set, whatever else: a take made
-- before the gate's Redis lost its data may commit after the set was
-- loaded again from MySQL, and its replay must not be answered short.
-- Returns 1 when the entry was still pending (or there was none).
local pending = 1
if ARGV[1] ~= '' then
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then
    return 0
  end
  pending = redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
if ARGV[2] == 'done' and ARGV[4] ~= '' then
  redis.call('SADD', KEYS[3], ARGV[4])
end
for i = 4, #KEYS do
  local q = tonumber(ARGV[i + 1])
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if ARGV[2] == 'back' then
      if pending == 1 then
        redis.call('HINCRBY', KEYS[i], 'stock', q)
        if ARGV[1] ~= '' then redis.call('HINCRBY', KEYS[i], 'held', -q) end
      end
    elseif pending == 1 then
      redis.call('HINCRBY', KEYS[i], 'held', -q)
    else
      redis.call('HINCRBY', KEYS[i], 'stock', -q)
    end
    redis.call('HINCRBY', KEYS[i], 'seq', 1)
  end
end
return pending
