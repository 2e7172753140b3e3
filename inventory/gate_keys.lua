-- Load Idempotency-Keys MySQL holds into the gate's key set, and mark the
-- set complete once all are in.
-- KEYS[1]: the key set; KEYS[2]: its completeness flag; KEYS[3]: the
-- run_id of the Redis process the set was completed on. ARGV[1]: mode;
-- ARGV[2]: the token (mode origin: the run_id now); ARGV[3]: the run_id
-- read before the load; ARGV[4..]: keys.
--   begin: the flag's value, set to the token if there was none. '1': the
--          set is complete already, load nothing.
--   add:   add the keys, if the flag still holds the token (the caller's
--          token was returned by begin). A flag gone since (the Redis lost
--          its data) means the caller's MySQL read may miss a key whose
--          marker was lost with it: nothing is added, 0 is returned.
--   done:  as add, then the flag says complete, on ARGV[3].
--   origin: the flag goes unless the set was completed on this process: a
--          Redis restarted from its persistence, or a replica promoted,
--          may have lost the latest keys with the latest writes. Returns
--          1 when it went.
local flag = redis.call('GET', KEYS[2])
if ARGV[1] == 'origin' then
  if flag ~= '1' or redis.call('GET', KEYS[3]) == ARGV[2] then
    return 0
  end
  redis.call('DEL', KEYS[2])
  return 1
end
if ARGV[1] == 'begin' then
  if not flag then
    redis.call('SET', KEYS[2], ARGV[2])
    return ARGV[2]
  end
  return flag
end
if flag ~= ARGV[2] then
  return 0
end
for i = 4, #ARGV do
  redis.call('SADD', KEYS[1], ARGV[i])
end
if ARGV[1] == 'done' then
  redis.call('SET', KEYS[2], '1')
  redis.call('SET', KEYS[3], ARGV[3])
end
return 1
