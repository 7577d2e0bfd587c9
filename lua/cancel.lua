--[[
  Cancels a task: no shard of it is claimed again, its running shards lose their tokens (their
  executors learn it at their next heartbeat, see extend.lua, and stop the handlers), and it
  ends `cancelled` without aggregation. Its refs waiting out a retry backoff leave `delayed` now,
  and those queued in its lane's wait too while it holds at most 10,000 refs
  (lua/include/lanes.lua, lane_drop_task); refs of it still queued in a longer lane, node lists
  or `reroute` are dropped by the claim that meets them (claim.lua try_ref). Its per-shard state
  (`task:<id>:shards`) goes now. Nothing here is proportional to more than 10,000 queued refs:
  `active`, `delayed` and a short lane are read.

  KEYS[1]  task:<id>          hash
  KEYS[2]  active             hash    ref -> token
  KEYS[3]  meta               hash    `cancels` counts cancellations (executors watch it)
  KEYS[4]  stalled            set
  KEYS[5]  task:<id>:terminal bitmap  of this task
  KEYS[6]  task:<id>:results  hash    of this task
  KEYS[7]  task:<id>:errors   hash    of this task
  KEYS[8]  task:<id>:keys     hash    of this task
  KEYS[9]  task:<id>:shards   hash    of this task
  KEYS[10] delayed            zset    ref -> due time (ms)
  KEYS[11] events             stream  the event log
  KEYS[12] expiring           zset    ended tasks with a retention, by expiry time
  KEYS[13] finished           zset    ended tasks, by end time
  KEYS[14] running            zset    tasks not finished
  KEYS[15] scheduled          zset    delayed tasks, by start time
  KEYS[16] unrouted           zset    routed tasks not fully placed
  KEYS[17] held               hash    held index shards per task and group (lua/include/fair.lua)
  KEYS[18] backups hash ref -> token of a shard's backup attempt (docs/design/speculation.md)
  KEYS[19] speculating zset ref -> claim ms of first attempts of tasks with --speculate
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id

  Returns how many running shards were stopped, or -3 (task missing), -9 (task already ended).

  include: clock, finish, lanes, stop
]]
local prefix, tid, now = ARGV[1], ARGV[2], now_ms()
local t = rcall('HMGET', K.task, 'state', 'kind')
local state = t[1]
if not state then return -3 end
if state == 'completed' or state == 'failed' or state == 'cancelled' then return -9 end
-- read first: its lane (tasks, wait), written below (docs/design/declared-keys.md)
touch_lane(prefix, t[2])
rcall('ZREM', lane_key(prefix, t[2], 'tasks'), tid)
-- its retries already due, queued in its lane: no work any more (a long lane is left to claims)
lane_drop_task(prefix, t[2], tid)
for _, set in ipairs({ K.unrouted, K.scheduled }) do rcall('ZREM', set, tid) end
local stopped = stop_refs(prefix, tid, now)
end_task(prefix, tid, 'cancelled', now)
return stopped
