--[[
  The home's decisions on a running task over partitions (docs/design/failure-policies.md, Over
  partitions): halted past its limit or when a handler asked, settled at its success goal. The
  decision is written in the home first; its shares are then stopped as it says
  (lua/stop_share.lua), by whoever repeats the home's `unreported` (a halt) or by the decision
  pass (a settle).

  include: events, finish, task
]]
-- Ends home record `tid` `failed` with reason `why`: it holds no shard itself, never aggregates,
-- and is listed in the home's `unreported`, whence each of its shares is halted.
local function halt_home(prefix, tid, why, now)
  rcall('HSET', task_key(prefix, tid, ''), 'halted', why)
  emit('event', 'task_halted', 'task', tid, 'reason', why, 'stopped', 0)
  end_task(prefix, tid, 'failed', now)
  rcall('ZADD', K.unreported, now, tid)
end

-- Decides on running home record `tid` from its shares' counts `done` and `failed` (summed by the
-- caller) and the first halt a handler asked for (`asked`, `<task index> <line>`, or nil): halts
-- it when asked or past its `max_failures`, or settles it (`cancelled` = 0: a settled task is one
-- with the field) when `done` reached its `success_when` with shards unended. Returns 1 halted,
-- 2 settled, 0 nothing decided (not running, decided before, or no limit crossed).
local function decide_home(prefix, tid, done, failed, asked, now)
  local tkey = task_key(prefix, tid, '')
  local t = rcall('HMGET', tkey, 'state', 'max_failures', 'success_when', 'cancelled', 'total', 'halted')
  if t[1] ~= 'running' or t[6] then return 0 end
  if asked then
    local idx, line = string.match(asked, '^(%d+) (.*)$')
    halt_home(prefix, tid, 'failed by its handler: shard ' .. (idx or '?') .. ' asked to fail the task: ' .. (line or asked), now)
    return 1
  end
  if t[2] and failed > tonumber(t[2]) then
    halt_home(prefix, tid, fast_reason(prefix, tid, failed), now)
    return 1
  end
  if t[3] and not t[4] and done >= tonumber(t[3]) and done + failed < tonumber(t[5]) then
    rcall('HSET', tkey, 'cancelled', 0)
    emit('event', 'task_settled', 'task', tid, 'done', done, 'cancelled', tonumber(t[5]) - done - failed, 'stopped', 0)
    return 2
  end
  return 0
end
