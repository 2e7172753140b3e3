-- Accept an order into the queue: take its lines from the gate's counters,
-- all or nothing, and append it to the stream, in one step.
-- KEYS[1]: the stream; KEYS[2]: the queued hash (order id -> entry);
-- KEYS[3]: the Idempotency-Key's marker (KEYS[2] again without a key);
-- KEYS[4]: the gate's key set; KEYS[5]: its completeness flag (as
-- gate_take.lua); KEYS[6..]: each line's SKU counter (as gate_take.lua).
-- ARGV[1]: order id; ARGV[2]: entry; ARGV[3]: key ('' for none); ARGV[4]:
-- '1' once the caller has looked the key up in MySQL, else '0';
-- ARGV[5..]: the lines' quantities.
-- Returns {0}: accepted; {1, id}: the key names order id already (nothing
-- taken); {2, i}: line i has no counter; {3, i}: line i is short; {4}: the
-- key is known to the gate (look it up in MySQL, then accept again with
-- ARGV[4] '1'); {5, 1}: the key may be in MySQL (the key set is not
-- complete): look it up first.

local unchecked = ARGV[3] ~= '' and ARGV[4] == '0'
if ARGV[3] ~= '' then
  local prev = redis.call('GET', KEYS[3])
  if prev then
    return {1, prev}
  end
  if unchecked and redis.call('SISMEMBER', KEYS[4], ARGV[3]) == 1 then
    return {4}
  end
end
for i = 6, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    return {2, i - 5}
  end
end
-- Unlike a sync order's flow, nothing after the accept looks for the key
-- before the answer: with an incomplete set (or one complete on another
-- Redis process: gate_take.lua), it is looked up first.
if unchecked and not complete(KEYS[5]) then
  return {5, 1}
end
for i = 6, #KEYS do
  if tonumber(redis.call('HGET', KEYS[i], 'stock')) < tonumber(ARGV[i - 1]) then
    return {3, i - 5}
  end
end
for i = 6, #KEYS do
  local q = tonumber(ARGV[i - 1])
  redis.call('HINCRBY', KEYS[i], 'stock', -q)
  redis.call('HINCRBY', KEYS[i], 'held', q)
  redis.call('HINCRBY', KEYS[i], 'seq', 1)
end
-- The entry carries its counter's epoch (gate_seed.lua): its settle tells
-- a take the counter lost with its Redis's data from one settled already.
redis.call('XADD', KEYS[1], '*', 'o', ARGV[2], 'e', redis.call('HGET', KEYS[6], 'epoch') or '')
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[1])
  redis.call('SADD', KEYS[4], ARGV[3])
end
return {0}
