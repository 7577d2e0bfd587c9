--[[
  Handles one fire time of a cron schedule, once across any number of coordinators: the first
  call for a fire time later than the schedule's last handled one records it and, unless told
  to skip it, creates the task `<name>-<fire time>` (the same id from every coordinator). Later
  calls for that fire time, or an earlier one, do nothing.

  KEYS[1]  schedules          hash   name -> schedule JSON (a removed schedule fires no more)
  KEYS[2]  schedule-state     hash   `<name>:last` last handled fire time (ms), `<name>:task` the
                                   task of the last fire
  KEYS[3]  task:<id>          hash   the task this fire time creates
  KEYS[4]  task:<id>:terminal bitmap of this task
  KEYS[5]  task:<id>:results  hash   of this task
  KEYS[6]  task:<id>:errors   hash   of this task
  KEYS[7]  task:<id>:shards   hash   of this task
  KEYS[8]  events             stream the event log
  KEYS[9]  expiring           zset   ended tasks with a retention, by expiry time
  KEYS[10] finished           zset   ended tasks, by end time
  KEYS[11] index              zset   every task, by creation time
  KEYS[12] marker             zset   wakes blocked executors
  KEYS[13] meta               hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[14] running            zset   tasks not finished
  KEYS[15] scheduled          zset   delayed tasks, by start time
  KEYS[16] kinds              set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[17] unrouted           zset   routed tasks not fully placed
  KEYS[18] held               hash   held shards per task (a new task's count starts at 0)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] name
  ARGV[3] fire_ms
  ARGV[4] run       1 to create the task, 0 to skip this fire time (missed, misfire skip)
  ARGV[5] overlap   `skip`: no task while the last fire's task is unfinished; `allow`
  ARGV[6] task id
  ARGV[7] priority
  ARGV[8] version   the schedule's `created_ms` as read, compared for equality only: a schedule
                    replaced or re-added since fires nothing
  ARGV[9..] field, value pairs of the task hash; on a partitioned queue the script adds
                    `partitions` and `partition_tags` from `meta` (so the task is a home record
                    over the queue's current partitions, whose shares the caller then creates)

  A fire time later than Redis's clock is not handled yet (-11): a coordinator whose clock runs
  ahead fires nothing early.

  Returns 1 task created, 0 already handled, -11 not due yet, 2 skipped (missed), 3 skipped (overlap), or a
  create_task refusal (-4 task exists, -8 invalid spec: the fire time still counts as handled).

  include: clock, create, events, lanes, task
]]
local prefix, name, fire, run, overlap, tid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local stored = rcall('HGET', K.schedules, name)
if not stored then return 0 end
local ok, s = pcall(cjson.decode, stored)
if not ok or tostring(s.created_ms) ~= tostring(tonumber(ARGV[8])) then return 0 end
local now = now_ms()
if fire > now then return -11 end
local last = tonumber(rcall('HGET', K.schedule_state, name .. ':last') or '-1')
if fire <= last then return 0 end
-- read first: the previous fire's task (a key this call cannot declare) before anything is
-- written, so that an abort at a key of a slot being migrated leaves the fire time unhandled
local prev = run == '1' and overlap == 'skip' and rcall('HGET', K.schedule_state, name .. ':task')
local prev_state = prev and rcall('HGET', task_key(prefix, prev, ''), 'state')
-- and the lane of the task's kind (create_task writes it last)
for i = 9, #ARGV - 1, 2 do
  if ARGV[i] == 'kind' and string.match(ARGV[i + 1], '^[A-Za-z0-9._-]+$') then touch_lane(prefix, ARGV[i + 1]) end
end
rcall('HSET', K.schedule_state, name .. ':last', fire)
if run ~= '1' then
  emit('event', 'schedule_missed', 'schedule', name, 'fire_ms', fire)
  return 2
end
if overlap == 'skip' then
  local state = prev_state
  if state and state ~= 'completed' and state ~= 'failed' and state ~= 'cancelled' then
    emit('event', 'schedule_overlap', 'schedule', name, 'fire_ms', fire, 'running', prev)
    return 3
  end
end
local fields = {}
for i = 9, #ARGV do fields[#fields + 1] = ARGV[i] end
local layout = rcall('HMGET', K.meta, 'partitions', 'partition_tags')
if tonumber(layout[1] or '1') > 1 then
  fields[#fields + 1] = 'partitions'
  fields[#fields + 1] = layout[1]
  fields[#fields + 1] = 'partition_tags'
  fields[#fields + 1] = layout[2]
end
local code = create_task(prefix, tid, now, tonumber(ARGV[7]), 0, fields)
if code == 1 then rcall('HSET', K.schedule_state, name .. ':task', tid) end
return code
