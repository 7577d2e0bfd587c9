--[[
  Stops a share as its home decided (docs/design/failure-policies.md, Over partitions): the home
  halted the task (`halt`: the share is withdrawn, its held and waiting refs stopped as for a
  cancel, and it ends `failed` with the home's reason), or settled it (`settle`: the same, then
  its unended shards are counted in `cancelled` and it ends `aggregating`, listed in its
  partition's `unreported` to be counted in the home, lua/report.lua). Only a share of the home's
  incarnation, not in a newer round than the one the caller read with the decision (a retry
  since runs it again), is stopped; one that ended on its own is left to its report, but for a
  halt, which ends it `failed` as its home (lua/end_share.lua would).

  KEYS[1]  task:<id>          hash   the share
  KEYS[2]  task:<id>:results  hash   of this share
  KEYS[3]  task:<id>:shards   hash   of this share
  KEYS[4]  active             hash   ref -> token
  KEYS[5]  delayed            zset   ref -> due time (ms)
  KEYS[6]  stalled            set
  KEYS[7]  meta               hash   `cancels` counts stops (executors watch it)
  KEYS[8]  held               hash   held index shards per task and group (lua/include/fair.lua)
  KEYS[9]  events             stream the event log
  KEYS[10] unreported         zset   (the partition's) shares ended, not yet counted in the home
  KEYS[11] unrouted           zset   routed tasks not fully placed
  KEYS[12] routed-nodes       set    nodes that may have a routed list
  KEYS[13] reroute            list   routed refs to place again
  KEYS[14] scheduled          zset   delayed tasks, by start time (a delayed share leaves it)
  KEYS[15] backups hash ref -> token of a shard's backup attempt (docs/design/speculation.md)
  KEYS[16] speculating zset ref -> claim ms of first attempts of tasks with --speculate
  ARGV[1] key prefix  `{P:Q@p.s}:` (the partition's)
  ARGV[2] task id
  ARGV[3] the home's incarnation id the share must name (`home_inc`)
  ARGV[4] the home's round read with its decision
  ARGV[5] `halt` or `settle`
  ARGV[6] the home's reason (a halt)

  Its event `share_stopped` is shown by `watch` with the home's (which adds its `partition`).

  Returns how many of its refs were held and stopped, or -1 when it was not stopped (another
  incarnation, a newer round, or neither running nor delayed: ended, or stopped before).

  include: clock, events, halt, lanes, stop, task
]]
local prefix, tid, now = ARGV[1], ARGV[2], now_ms()
local t = rcall('HMGET', K.task, 'home_inc', 'home_seq', 'state', 'round', 'kind', 'done', 'failed', 'total', 'keep_results', 'part')
if (t[1] or t[2]) ~= ARGV[3] or not t[10] or tonumber(t[4] or '0') > tonumber(ARGV[4]) then return -1 end
local halt = ARGV[5] == 'halt'
if halt and t[3] == 'aggregating' then
  -- ended on its own, not yet counted: it ends as its home
  rcall('HSET', K.task, 'state', 'failed', 'finished_ms', now)
  if t[9] == '0' then
    rcall('DEL', task_key(prefix, tid, ':results'))
    rcall('HSET', K.task, 'results_dropped', 1)
  end
  return 0
end
-- (a delayed share, its start not yet come, stops too)
if t[3] ~= 'running' and t[3] ~= 'delayed' then return -1 end
-- read first: its lane and its node lists, written below (docs/design/declared-keys.md)
touch_lane(prefix, t[5])
touch_halt(prefix, tid)
rcall('ZREM', K.scheduled, tid)
withdraw_queued(prefix, tid, t[5])
local stopped = stop_refs(prefix, tid, now)
if halt then
  rcall('HSET', K.task, 'halted', ARGV[6], 'state', 'failed', 'finished_ms', now)
  if t[9] == '0' then
    rcall('DEL', task_key(prefix, tid, ':results'))
    rcall('HSET', K.task, 'results_dropped', 1)
  end
  emit('event', 'share_stopped', 'task', tid, 'stopped', stopped, 'cancelled', 0)
else
  local cancelled = tonumber(t[8]) - tonumber(t[6]) - tonumber(t[7])
  rcall('HSET', K.task, 'cancelled', cancelled, 'state', 'aggregating', 'aggregating_ms', now)
  rcall('ZADD', K.unreported, now, tid)
  emit('event', 'share_stopped', 'task', tid, 'stopped', stopped, 'cancelled', cancelled)
end
return stopped
