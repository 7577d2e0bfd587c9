--[[
  The home's decisions on a running task over partitions (docs/design/failure-policies.md, Over
  partitions): halted past its limit or when a handler asked, settled at its success goal. The
  decision is written in the home first; its shares are then stopped as it says
  (lua/stop_share.lua), by whoever repeats the home's `unreported` (a halt) or by the decision
  pass (a settle).

  include: events, finish, task
]]
-- Ends home record `tid` `failed` with reason `why`: it holds no shard itself, never aggregates,
-- and is listed in the home's `unreported`, whence each of its shares is halted. A delayed home
-- leaves `scheduled` too.
local function halt_home(prefix, tid, why, now)
  rcall('HSET', task_key(prefix, tid, ''), 'halted', why)
  rcall('ZREM', K.scheduled, tid)
  emit('event', 'task_halted', 'task', tid, 'reason', why, 'stopped', 0)
  end_task(prefix, tid, 'failed', now)
  rcall('ZADD', K.unreported, now, tid)
end

-- Decides on home record `tid`, running (or delayed: its shares may start before it on their
-- servers' clocks), from its shares' counts `done` and `failed` (summed by the caller), the first
-- halt a handler asked for (`asked`, `<task index> <line>`, or nil) and the reason of a share
-- found halted in the home's round (`halted`, or nil: the home lost that decision in a failover,
-- its shares kept it). Halts it when a share was halted, when asked or past its `max_failures`;
-- settles it (`cancelled` = 0: a settled task is one with the field) when `done` reached its
-- `success_when` with shards unended. A decision is final: a halted or settled task is not
-- decided on again. Returns 1 halted, 2 settled, 0 nothing decided.
local function decide_home(prefix, tid, done, failed, asked, halted, now)
  local tkey = task_key(prefix, tid, '')
  local t = rcall('HMGET', tkey, 'state', 'max_failures', 'success_when', 'cancelled', 'total', 'halted')
  if (t[1] ~= 'running' and t[1] ~= 'delayed') or t[6] or t[4] then return 0 end
  if halted then
    halt_home(prefix, tid, halted, now)
    return 1
  end
  if asked then
    local idx, line = string.match(asked, '^(%d+) (.*)$')
    halt_home(prefix, tid, 'failed by its handler: shard ' .. (idx or '?') .. ' asked to fail the task: ' .. (line or asked), now)
    return 1
  end
  if t[2] and failed > tonumber(t[2]) then
    halt_home(prefix, tid, fast_reason(prefix, tid, failed), now)
    return 1
  end
  if t[3] and done >= tonumber(t[3]) and done + failed < tonumber(t[5]) then
    rcall('HSET', tkey, 'cancelled', 0)
    emit('event', 'task_settled', 'task', tid, 'done', done, 'cancelled', tonumber(t[5]) - done - failed, 'stopped', 0)
    return 2
  end
  return 0
end
