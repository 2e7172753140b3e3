-- Take every line's quantity from its SKU's gate counter, all or nothing,
-- and record the take as pending until its order commits or is given back.
-- KEYS[1]: the pending hash (tag -> entry); KEYS[2]: the due sorted set
-- (tag -> deadline, ms); KEYS[3]: the set of Idempotency-Keys the gate has
-- taken for; KEYS[4]: its flag ('c:<id>:...': every key MySQL holds is
-- in the set, as loaded on the Redis process and replication history id;
-- gate_keys.lua); KEYS[5]: the key's queued-order marker (KEYS[3] again when
-- there is no key, or for an order); KEYS[6..]: each line's SKU counter
-- hash (fields stock: what the gate still admits; held: taken and not yet
-- settled; seq: bumped by every change, for the reconciler's
-- compare-and-set).
-- ARGV[1]: tag; ARGV[2]: entry; ARGV[3]: deadline (ms); ARGV[4]: the
-- Idempotency-Key ('' for none); ARGV[5]: '1' once the caller has looked
-- the key up in MySQL, else '0'; ARGV[6..]: the lines' quantities.
-- Returns {0}: taken; {1}: the tag is in flight already (nothing taken);
-- {2, i}: line i has no counter (seed it); {3, i}: line i is short;
-- {4}: the key is known (look it up in MySQL, then take again with
-- ARGV[5] '1'); {5, i}: line i is short and the key may be in MySQL
-- (look it up before answering short); {6}: the key names a queued order.

local key, unchecked = ARGV[4], ARGV[4] ~= '' and ARGV[5] == '0'
if KEYS[5] ~= KEYS[3] and redis.call('EXISTS', KEYS[5]) == 1 then
  return {6}
end
if unchecked and redis.call('SISMEMBER', KEYS[3], key) == 1 then
  return {4}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {1}
end
for i = 6, #KEYS do
  local stock = redis.call('HGET', KEYS[i], 'stock')
  if not stock then
    return {2, i - 5}
  end
  if tonumber(stock) < tonumber(ARGV[i]) then
    -- Complete on another process (restarted from its persistence, or a
    -- promoted replica) or history (a failback), the set may have lost
    -- the latest keys.
    if unchecked and not complete(KEYS[4]) then
      return {5, i - 5}
    end
    return {3, i - 5}
  end
end
for i = 6, #KEYS do
  local q = tonumber(ARGV[i])
  redis.call('HINCRBY', KEYS[i], 'stock', -q)
  redis.call('HINCRBY', KEYS[i], 'held', q)
  redis.call('HINCRBY', KEYS[i], 'seq', 1)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if key ~= '' then
  redis.call('SADD', KEYS[3], key)
end
return {0}
