--[[
  Handles one fire time of a cron schedule, once across any number of coordinators: the first
  call for a fire time later than the schedule's last handled one records it and, unless told
  to skip it, creates the task `<name>-<fire time>` (the same id from every coordinator). Later
  calls for that fire time, or an earlier one, do nothing.

  KEYS[1] schedules        hash    name -> schedule JSON (a removed schedule fires no more)
  KEYS[2] schedule-state   hash    `<name>:last` last handled fire time (ms), `<name>:task` the
                                   task of the last fire
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] name
  ARGV[3] fire_ms
  ARGV[4] run       1 to create the task, 0 to skip this fire time (missed, misfire skip)
  ARGV[5] overlap   `skip`: no task while the last fire's task is unfinished; `allow`
  ARGV[6] task id
  ARGV[7] priority
  ARGV[8] created_ms  of the schedule read: a schedule replaced or re-added since fires nothing
  ARGV[9..] field, value pairs of the task hash

  A fire time later than Redis's clock is not handled yet (-11): a coordinator whose clock runs
  ahead fires nothing early.

  Returns 1 task created, 0 already handled, -11 not due yet, 2 skipped (missed), 3 skipped (overlap), or a
  create_task refusal (-4 task exists, -8 invalid spec: the fire time still counts as handled).
]]
local prefix, name, fire, run, overlap, tid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local stored = rcall('HGET', KEYS[1], name)
if not stored then return 0 end
local ok, s = pcall(cjson.decode, stored)
if not ok or tostring(s.created_ms) ~= tostring(tonumber(ARGV[8])) then return 0 end
local now = now_ms()
if fire > now then return -11 end
local last = tonumber(rcall('HGET', KEYS[2], name .. ':last') or '-1')
if fire <= last then return 0 end
rcall('HSET', KEYS[2], name .. ':last', fire)
if run ~= '1' then
  emit(prefix, 'event', 'schedule_missed', 'schedule', name, 'fire_ms', fire)
  return 2
end
if overlap == 'skip' then
  local prev = rcall('HGET', KEYS[2], name .. ':task')
  local state = prev and rcall('HGET', prefix .. 'task:' .. prev, 'state')
  if state and state ~= 'completed' and state ~= 'failed' and state ~= 'cancelled' then
    emit(prefix, 'event', 'schedule_overlap', 'schedule', name, 'fire_ms', fire, 'running', prev)
    return 3
  end
end
local fields = {}
for i = 9, #ARGV do fields[#fields + 1] = ARGV[i] end
local code = create_task(prefix, tid, now, tonumber(ARGV[7]), 0, fields)
if code == 1 then rcall('HSET', KEYS[2], name .. ':task', tid) end
return code
