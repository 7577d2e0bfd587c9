--[[
  Stopping a task's held and waiting refs, for a cancel (lua/cancel.lua) and a halt
  (lua/include/halt.lua).

  include: chunked, fair, task
]]
-- Takes task `tid`'s refs out of `active` (their executors stop the handlers, learning it from
-- `cancels`, raised here, at their next heartbeat: docs/design/lock-protocol.md) and `delayed`
-- (no executor wakes for them), forgets its held count and its per-shard state; the attempts its
-- stopped shards ran are kept in `attempt_hw` (a retry numbers past them); their backup attempts
-- leave `backups`. Only `active`, `backups` and `delayed` are read. Returns how many refs were held.
local function stop_refs(prefix, tid, now)
  local pre = tid .. ':'
  local stopped = {}
  for _, ref in ipairs(rcall('HKEYS', K.active)) do
    if string.sub(ref, 1, #pre) == pre then stopped[#stopped + 1] = ref end
  end
  unhold_all(prefix, tid, now)
  for _, ref in ipairs(stopped) do
    local _, _, idx = split_ref(ref)
    raise_attempt_hw(prefix, tid, rcall('HGET', shards_key(prefix, tid), idx .. ':attempt') or 1)
  end
  if #stopped > 0 then
    call_chunked('HDEL', K.active, stopped)
    call_chunked('SREM', K.stalled, stopped)
    call_chunked('ZREM', K.speculating, stopped)
  end
  -- their backup attempts (docs/design/speculation.md) stop too
  local backups = {}
  for _, ref in ipairs(rcall('HKEYS', K.backups)) do
    if string.sub(ref, 1, #pre) == pre then backups[#backups + 1] = ref end
  end
  if #backups > 0 then call_chunked('HDEL', K.backups, backups) end
  local gone = {}
  for _, ref in ipairs(rcall('ZRANGE', K.delayed, 0, -1)) do
    if string.sub(ref, 1, #pre) == pre then gone[#gone + 1] = ref end
  end
  if #gone > 0 then call_chunked('ZREM', K.delayed, gone) end
  rcall('DEL', shards_key(prefix, tid))
  rcall('HINCRBY', K.meta, 'cancels', 1)
  return #stopped
end
