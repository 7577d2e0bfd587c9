--[[
  Halting a task that failed fast (docs/design/failure-policies.md): past its `max_failures`, or
  asked by a handler's `fail_task`. As a cancel, but it ends `failed`, with its reason.

  include: events, finish, lanes, stop, task
]]
-- Reads the derived keys a halt of task `tid` writes that `touch_task` does not (a routed task's
-- node lists), before a script's first write (docs/design/declared-keys.md, order of writes):
-- called when the script may halt it.
local function touch_halt(prefix, tid)
  if rcall('HGET', task_key(prefix, tid, ''), 'strategy') == 'pull' then return end
  for _, n in ipairs(rcall('SMEMBERS', K.routed_nodes)) do rcall('EXISTS', prefix .. 'node:' .. n .. ':wait') end
end

-- Takes running task `tid` (of kind `kind`) out of its runnable set and `unrouted`, and its
-- queued refs out of its lists (each of at most 10,000 refs; longer ones are left to the claims,
-- so that a retry requeues each unfinished shard once): nothing of it is claimed any more.
local function withdraw_queued(prefix, tid, kind)
  rcall('ZREM', lane_key(prefix, kind, 'tasks'), tid)
  rcall('ZREM', K.unrouted, tid)
  lane_drop_task(prefix, kind, tid)
  if rcall('HGET', task_key(prefix, tid, ''), 'strategy') ~= 'pull' then
    for _, n in ipairs(rcall('SMEMBERS', K.routed_nodes)) do list_drop_task(prefix .. 'node:' .. n .. ':wait', tid) end
    list_drop_task(K.reroute, tid)
  end
end

-- Ends running task `tid` `failed` at once with reason `why`: it leaves its lane's runnable set
-- and `unrouted`, its refs leave `active` (their executors stop them, learning it from
-- `cancels`), `delayed` and the lists that hold them (lanes, node lists, `reroute`, each of at
-- most 10,000 refs), its held count goes, it never aggregates. Refs of it left in longer lists
-- are dropped by the claims that meet them. Returns 1, or 0 when it is not running (or is
-- a share: over partitions the home decides). The caller has read the task's keys and lane first
-- (`touch_task`, `touch_halt`).
local function halt_task(prefix, tid, why, now)
  local tkey = task_key(prefix, tid, '')
  local t = rcall('HMGET', tkey, 'state', 'kind', 'part')
  if t[1] ~= 'running' or t[3] then return 0 end
  withdraw_queued(prefix, tid, t[2])
  local stopped = stop_refs(prefix, tid, now)
  rcall('HSET', tkey, 'halted', why)
  emit('event', 'task_halted', 'task', tid, 'reason', why, 'stopped', stopped)
  end_task(prefix, tid, 'failed', now)
  return 1
end
