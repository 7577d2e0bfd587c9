--[[
  Settling a task that met its `success_when` (k-of-n, docs/design/failure-policies.md): its
  unfinished shards are cancelled and it aggregates at once.

  include: events, finish, halt, stop, task
]]
-- Settles running task `tid`: nothing more of it is claimed, its held and waiting refs are
-- stopped (their executors stop the handlers and report them cancelled), its unfinished shards
-- are counted in `cancelled` (a settled task is one that has the field), and its aggregation
-- job is enqueued. Returns 1,
-- or 0 when it is not running (or is a share). The caller has read the task's keys and lane
-- first (`touch_task`, `touch_halt`) and done its own writes.
local function settle_task(prefix, tid, now)
  local tkey = task_key(prefix, tid, '')
  local t = rcall('HMGET', tkey, 'state', 'kind', 'part', 'done', 'failed', 'total', 'seq')
  if t[1] ~= 'running' or t[3] then return 0 end
  withdraw_queued(prefix, tid, t[2])
  local stopped = stop_refs(prefix, tid, now)
  local cancelled = tonumber(t[6]) - tonumber(t[4]) - tonumber(t[5])
  rcall('HSET', tkey, 'cancelled', cancelled)
  emit('event', 'task_settled', 'task', tid, 'done', t[4], 'cancelled', cancelled, 'stopped', stopped)
  enqueue_aggregation(prefix, tid, t[4], t[5], t[7], now)
  return 1
end
