-- Write a SKU's cached stock and version, by mode.
-- KEYS[1]: the SKU's hash; ARGV[1]: stock; ARGV[2]: version;
-- ARGV[3]: the entry's time to live in ms; ARGV[4]: mode.
--   newer:  replace only an older entry, or none. Writers finish in any
--           order (a replica paused after its commit writes late), so the
--           cache never goes back to an older stock.
--   settle: as newer, but an entry newer than ARGV[2] is deleted. The
--           caller knows ARGV[2] to be MySQL's latest (it holds the SKU's
--           lease, or read the row to settle a conflict): a newer entry is
--           then a stale one from another truth (a restored database) or a
--           race, and a miss is always safe.
--   force:  replace whatever is there (an admin's reset, under the lease).
-- Returns the entry kept, or nothing when there is none.
local cur = redis.call('HGET', KEYS[1], 'version')
local mode = ARGV[4]
if mode == 'force' or not cur or tonumber(cur) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'version', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {ARGV[1], ARGV[2]}
end
if mode == 'settle' and tonumber(cur) > tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
  return false
end
return redis.call('HMGET', KEYS[1], 'stock', 'version')
