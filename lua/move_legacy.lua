--[[
  Moves what a version before lanes (docs/design/lanes.md) queued into the lanes:
  refs of the queue-wide `wait` list to their kind's lane wait, tasks of the queue-wide `tasks`
  zset to their kind's lane `tasks` (same score). At most 1000 of each per call; a ref of
  another incarnation, or of a task gone, is dropped. Run by every sweep loop once per full
  sweep, so that executors and coordinators of both versions may run side by side during an
  upgrade: what an old one queues reaches a lane within one sweep interval.

  KEYS[1] wait   list  refs queued by an older version
  KEYS[2] tasks  zset  runnable tasks queued by an older version
  KEYS[3] kinds  set   kinds that may have a lane
  ARGV[1] key prefix  `{P:Q}:`

  Returns how many refs and tasks were moved.

  include: lanes, task
]]
local prefix = ARGV[1]
local refs = rcall('LRANGE', K.wait, 0, 999)
local tasks = rcall('ZRANGE', K.tasks, 0, 999, 'WITHSCORES')
if #refs == 0 and #tasks == 0 then return 0 end
-- read first: where each goes (a kind that is no name stays where it is)
local named = function(k) return k and #k <= 64 and string.match(k, '^[A-Za-z0-9._-]+$') end
local ref_kind, task_kind = {}, {}
for i, ref in ipairs(refs) do
  local tid, inc = split_ref(ref)
  local t = tid and rcall('HMGET', task_key(prefix, tid, ''), 'seq', 'kind')
  if t and t[1] == inc and named(t[2]) then
    ref_kind[i] = t[2]
    touch_lane(prefix, t[2])
  end
end
for i = 1, #tasks, 2 do
  local k = rcall('HGET', task_key(prefix, tasks[i], ''), 'kind')
  if named(k) then
    task_kind[i] = k
    touch_lane(prefix, k)
  end
end
local moved = 0
rcall('LTRIM', K.wait, #refs, -1)
for i, ref in ipairs(refs) do
  if ref_kind[i] then
    lane_push(prefix, ref_kind[i], { ref }, false)
    moved = moved + 1
  end
end
for i = 1, #tasks, 2 do
  rcall('ZREM', K.tasks, tasks[i])
  if task_kind[i] then
    rcall('SADD', K.kinds, task_kind[i])
    rcall('ZADD', lane_key(prefix, task_kind[i], 'tasks'), tasks[i + 1], tasks[i])
    wake_lane(prefix, task_kind[i])
    moved = moved + 1
  end
end
return moved
