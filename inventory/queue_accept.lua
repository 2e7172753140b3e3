-- Accept an order into the queue: take its lines from the gate's counters,
-- all or nothing, and append it to the stream, in one step.
-- KEYS[1]: the stream; KEYS[2]: the queued hash (order id -> entry);
-- KEYS[3]: the Idempotency-Key's marker (KEYS[2] again without a key);
-- KEYS[4..]: each line's SKU counter (as gate_take.lua).
-- ARGV[1]: order id; ARGV[2]: entry; ARGV[3]: key ('' for none);
-- ARGV[4..]: the lines' quantities.
-- Returns {0}: accepted; {1, id}: the key names order id already (nothing
-- taken); {2, i}: line i has no counter; {3, i}: line i is short.
if ARGV[3] ~= '' then
  local prev = redis.call('GET', KEYS[3])
  if prev then
    return {1, prev}
  end
end
for i = 4, #KEYS do
  local stock = redis.call('HGET', KEYS[i], 'stock')
  if not stock then
    return {2, i - 3}
  end
  if tonumber(stock) < tonumber(ARGV[i]) then
    return {3, i - 3}
  end
end
for i = 4, #KEYS do
  local q = tonumber(ARGV[i])
  redis.call('HINCRBY', KEYS[i], 'stock', -q)
  redis.call('HINCRBY', KEYS[i], 'held', q)
  redis.call('HINCRBY', KEYS[i], 'seq', 1)
end
redis.call('XADD', KEYS[1], '*', 'o', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[1])
end
return {0}
