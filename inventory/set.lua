-- Replace a SKU's cached stock only with a newer version.
-- KEYS[1]: the SKU's hash; ARGV[1]: stock; ARGV[2]: version.
-- Writers finish in any order (a replica paused after its commit writes
-- late), so an entry is replaced only when it holds an older version, or
-- none: the cache never goes back to an older stock. Returns the entry kept.
local cur = redis.call('HGET', KEYS[1], 'version')
if not cur or tonumber(cur) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'version', ARGV[2])
  return {ARGV[1], ARGV[2]}
end
return redis.call('HMGET', KEYS[1], 'stock', 'version')
