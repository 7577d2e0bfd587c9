--[[
  Counts one partition's ended share of a task in the task's home record, once
  (docs/design/partitions.md): the field `part:<p>` (and `round:<p>`, the round it
  was counted in) is set only by the first report of a round, and only that call adds the
  share's final counts to the home's `done`, `failed` and, for a share settled as its home
  ordered, `cancelled` (a count of an older round is replaced). When every share is counted the
  home's counts reach its total and the aggregation job is enqueued in the home, once
  (lua/include/finish.lua enqueue_aggregation). Repeated by whoever finds the share still in its
  partition's `unreported` (the executor that ended it, then every sweep), so a crash between
  the partition's write and this one loses nothing and counts nothing twice.

  KEYS[1]  task:<id>          hash   the home record
  KEYS[2]  kinds              set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[3]  meta               hash   queue metadata (events_maxlen)
  KEYS[4]  events             stream the event log
  KEYS[5]  task:<id>:terminal bitmap of this task (its retention, when it halts)
  KEYS[6]  task:<id>:results  hash   of this task
  KEYS[7]  task:<id>:errors   hash   of this task
  KEYS[8]  task:<id>:keys     hash   of this task
  KEYS[9]  task:<id>:shards   hash   of this task
  KEYS[10] expiring           zset   ended tasks with a retention, by expiry time
  KEYS[11] finished           zset   ended tasks, by end time
  KEYS[12] running            zset   tasks not finished
  KEYS[13] unreported         zset   (the home's) ended tasks whose shares to end or stop
  KEYS[14] scheduled          zset   delayed tasks, by start time (a halted one leaves it)
  ARGV[1] key prefix  `{P:Q}:` (the home's)
  ARGV[2] task id
  ARGV[3] the home record's incarnation id (`inc`) the share was dispatched for
  ARGV[4] partition p
  ARGV[5] the home's round the share ran in
  ARGV[6] the share's done
  ARGV[7] the share's failed
  ARGV[8] the share's cancelled: its unended shards when it was settled as its home ordered
          (lua/stop_share.lua), or 0
  ARGV[9] the first halt a handler of the share asked for, `<task index> <line>`, or ''
  ARGV[10] the share's first failure, `<task index> <line>`, or ''

  A count that puts the task past its `max_failures`, or a share whose handler asked to fail the
  task, halts it instead (lua/include/decide.lua): the last shares' reports decide as the
  decision pass would, so that no task aggregates past its limit. A count that reaches its
  `success_when` with shards unended settles it.

  Returns 1 counted, 0 counted before (or for an older round, another incarnation or a state
  that no longer takes it: nothing to count, acknowledge it), 2 the share ran in a round ahead
  of the home's (the home's master lost a `reopen.lua` its shares kept: the caller reopens the
  home to that round for this partition, then reports again), -3 the home record is gone.

  include: clock, decide, events, finish, lanes
]]
local prefix, tid, inc, p, round = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local t = rcall('HMGET', K.task, 'inc', 'round', 'state', 'partitions', 'seq')
if not t[5] then return -3 end
if (t[1] or t[5]) ~= inc or not t[4] or t[3] == 'cancelled' then return 0 end
if tonumber(round) > tonumber(t[2] or '0') then return 2 end
-- a delayed home (`--delay`) counts too: its shares start at about its start time
if (t[2] or '0') ~= round or (t[3] ~= 'running' and t[3] ~= 'delayed') then return 0 end
-- read first: the lane the aggregation job may go to
touch_task_lane(prefix, tid)
local counted = rcall('HMGET', K.task, 'part:' .. p, 'round:' .. p)
if counted[1] then
  -- counted before in this round (or by a record without its round): nothing to count
  if not counted[2] or tonumber(counted[2]) >= tonumber(round) then return 0 end
  -- counted in an older round, and the share ran again since (the home lost the reopen that
  -- forgot this count, and took the round back from another share's report): replaced
  local d, f, c = share_count(counted[1])
  rcall('HINCRBY', K.task, 'done', 0 - d)
  rcall('HINCRBY', K.task, 'failed', 0 - f)
  if c > 0 then rcall('HINCRBY', K.task, 'cancelled', 0 - c) end
end
local cancelled = tonumber(ARGV[8] or '0')
local count = ARGV[6] .. '/' .. ARGV[7]
-- a settled share: its home is settled too (the report makes it so if the home lost its decision)
if cancelled > 0 then count = count .. '/' .. cancelled end
rcall('HSET', K.task, 'part:' .. p, count, 'round:' .. p, round)
rcall('HINCRBY', K.task, 'done', ARGV[6])
rcall('HINCRBY', K.task, 'failed', ARGV[7])
if cancelled > 0 then rcall('HINCRBY', K.task, 'cancelled', cancelled) end
emit('event', 'share_counted', 'task', tid, 'partition', p, 'done', ARGV[6], 'failed', ARGV[7])
if (ARGV[10] or '') ~= '' then rcall('HSETNX', K.task, 'first_failure', ARGV[10]) end
local c = rcall('HMGET', K.task, 'done', 'failed', 'total', 'cancelled')
local asked = (ARGV[9] or '') ~= '' and ARGV[9] or nil
if decide_home(prefix, tid, tonumber(c[1]), tonumber(c[2]), asked, nil, now_ms()) == 1 then return 1 end
c = rcall('HMGET', K.task, 'done', 'failed', 'total', 'cancelled')
if tonumber(c[1]) + tonumber(c[2]) + tonumber(c[4] or '0') == tonumber(c[3]) then
  enqueue_aggregation(prefix, tid, c[1], c[2], t[5], now_ms())
end
return 1
