-- Load Idempotency-Keys MySQL holds into the gate's key set, and mark the
-- set complete once all are in.
-- KEYS[1]: the key set; KEYS[2]: its flag:
--   'l:<id>:<us>': a load begun at Redis time us on the Redis process
--                  id is under way (id: its run_id, then its replication
--                  history's, master_replid, which a promotion changes);
--   'c:<id>:<us>': complete, as loaded on id by the load begun at
--                      us, and to be loaded once more once the bound has
--                      passed since us: a take made before the set was
--                      lost may commit after the first load read MySQL;
--   'c:<id>:0':    complete, loaded again.
-- ARGV[1]: mode; then:
--   begin (ARGV[2]: the bound, ms): 'c' when complete on this process and
--          not due to be loaded again; else the token to load under: the
--          flag, or a new load's (no flag, or a flag of another process: a
--          restart from its persistence or a promoted replica may have
--          lost the latest keys and kept the flag).
--   add (ARGV[2]: the token; ARGV[3..]: keys): add the keys, if the flag
--          still holds the token, on this process (a Redis that lost its
--          data, or another process, may lack keys the caller's MySQL read
--          missed). Returns 0 when not, else 1.
--   done:  as add, then the flag says complete (loaded again if the token
--          was a complete one).
--   drop (ARGV[2]: the token): the flag goes if it holds the token (the
--          keys are too many to load). Returns 1 then.
--   reset: the set and its flag go (a load under way adds nothing more).
--   forget: the flag goes, the keys stay (a load under way adds nothing
--          more; the next begins afresh and is loaded twice).
local mode, flag = ARGV[1], redis.call('GET', KEYS[2])
if mode == 'reset' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
if mode == 'forget' then
  redis.call('DEL', KEYS[2])
  return 1
end
local id = process_id()
if not id then
  return redis.error_reply('INFO without run_id or master_replid')
end
local state, begun
if flag then
  local of
  state, of, begun = string.match(flag, '^(%a):(%x+):(%d+)$')
  if of ~= id then
    state = nil
  end
end
if mode == 'begin' then
  if state == 'c' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if begun == '0' or now - tonumber(begun) < tonumber(ARGV[2]) * 1000 then
      return 'c'
    end
  elseif state ~= 'l' then
    local t = redis.call('TIME')
    flag = 'l:' .. id .. ':' .. t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', KEYS[2], flag)
  end
  return flag
end
if not state or flag ~= ARGV[2] then
  return 0
end
if mode == 'drop' then
  redis.call('DEL', KEYS[2])
  return 1
end
for i = 3, #ARGV do
  redis.call('SADD', KEYS[1], ARGV[i])
end
if mode == 'done' then
  if state == 'c' then
    begun = '0'
  end
  redis.call('SET', KEYS[2], 'c:' .. id .. ':' .. begun)
end
return 1
