-- Seed or reset a SKU's gate counter from MySQL's stock.
-- KEYS[1]: the counter; KEYS[2]: the set of gated SKUs. ARGV[1]: MySQL's
-- stock; ARGV[2]: mode; ARGV[3]: the SKU; ARGV[4]: the seq read before
-- MySQL (mode reconcile).
--   seed:      only if there is no counter (two replicas seeding at once
--              set it once, as SET NX), with a new epoch (the server's
--              time): a take made before the counter was lost (its
--              Redis's data lost) carries another.
--   reset:     an admin's PUT: stock = MySQL's less what is in flight,
--              which will be taken from the new stock as it commits; the
--              epoch is kept (a new one for a new counter).
--   reconcile: only if nothing is in flight and nothing changed since the
--              caller read seq before reading MySQL.
-- Returns 1 when the counter was written.
local mode = ARGV[2]
local function epoch()
  local t = redis.call('TIME')
  return t[1] .. '.' .. t[2]
end
if mode == 'seed' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'held', 0, 'seq', 1, 'epoch', epoch())
elseif mode == 'reset' then
  local held = tonumber(redis.call('HGET', KEYS[1], 'held') or '0')
  redis.call('HSET', KEYS[1], 'stock', tonumber(ARGV[1]) - held, 'held', held)
  redis.call('HINCRBY', KEYS[1], 'seq', 1)
  if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then
    redis.call('HSET', KEYS[1], 'epoch', epoch())
  end
else
  local v = redis.call('HMGET', KEYS[1], 'held', 'seq')
  if v[1] ~= '0' or v[2] ~= ARGV[4] then return 0 end
  redis.call('HSET', KEYS[1], 'stock', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'seq', 1)
end
redis.call('SADD', KEYS[2], ARGV[3])
return 1
