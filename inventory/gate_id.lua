-- Prepended to gate_take.lua, queue_accept.lua and gate_keys.lua.

-- process_id names this Redis process and its replication history: its
-- run_id, then its master_replid, which changes at every promotion (a
-- failback keeps the run_id and may have resynced, losing keys); nil when
-- INFO lacks either. The second result says whether it is a master.
local function process_id()
  local repl = redis.call('INFO', 'replication')
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local replid = string.match(repl, 'master_replid:(%x+)')
  if not run or not replid then
    return nil, false
  end
  return run .. replid, string.find(repl, 'role:master', 1, true) ~= nil
end

-- complete reports whether the key set whose flag is at flagKey holds
-- every key MySQL does: loaded on this process, in this history
-- (gate_keys.lua), and this process is a master (a demoted master serves
-- its stale data under its own ids until it has synced).
local function complete(flagKey)
  local flag = redis.call('GET', flagKey)
  if not flag then
    return false
  end
  local id, master = process_id()
  if not id or not master then
    return false
  end
  local prefix = 'c:' .. id .. ':'
  return string.sub(flag, 1, #prefix) == prefix
end
