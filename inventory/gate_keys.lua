-- Load Idempotency-Keys MySQL holds into the gate's key set, and mark the
-- set complete once all are in.
-- KEYS[1]: the key set; KEYS[2]: its completeness flag. ARGV[1]: mode;
-- ARGV[2]: the token; ARGV[3..]: keys.
--   begin: the flag's value, set to the token if there was none. '1': the
--          set is complete already, load nothing.
--   add:   add the keys, if the flag still holds the token (the caller's
--          token was returned by begin). A flag gone since (the Redis lost
--          its data) means the caller's MySQL read may miss a key whose
--          marker was lost with it: nothing is added, 0 is returned.
--   done:  as add, then the flag says complete.
local flag = redis.call('GET', KEYS[2])
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
for i = 3, #ARGV do
  redis.call('SADD', KEYS[1], ARGV[i])
end
if ARGV[1] == 'done' then
  redis.call('SET', KEYS[2], '1')
end
return 1
