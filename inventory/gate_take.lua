-- Take every line's quantity from its SKU's gate counter, all or nothing,
-- and record the take as pending until its order commits or is given back.
-- KEYS[1]: the pending hash (tag -> entry); KEYS[2]: the due sorted set
-- (tag -> deadline, ms); KEYS[3..]: each line's SKU counter hash (fields
-- stock: what the gate still admits; held: taken and not yet settled; seq:
-- bumped by every change, for the reconciler's compare-and-set).
-- ARGV[1]: tag; ARGV[2]: entry; ARGV[3]: deadline (ms); ARGV[4..]: the
-- lines' quantities.
-- Returns {0}: taken; {1}: the tag is in flight already (nothing taken);
-- {2, i}: line i has no counter (seed it); {3, i}: line i is short.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {1}
end
for i = 3, #KEYS do
  local stock = redis.call('HGET', KEYS[i], 'stock')
  if not stock then
    return {2, i - 2}
  end
  if tonumber(stock) < tonumber(ARGV[i + 1]) then
    return {3, i - 2}
  end
end
for i = 3, #KEYS do
  local q = tonumber(ARGV[i + 1])
  redis.call('HINCRBY', KEYS[i], 'stock', -q)
  redis.call('HINCRBY', KEYS[i], 'held', q)
  redis.call('HINCRBY', KEYS[i], 'seq', 1)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return {0}
