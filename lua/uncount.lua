--[[
  Forgets the count of a share that lost writes after it was counted in the home (a failover of
  its partition's master: replication is asynchronous), found by the aggregation: the share is
  running again (its lost shards are claimed or recovered and run again) or is gone (the
  reconciliation creates it again). Its `part:<p>` field goes, its counts leave `done`,
  `failed` and `cancelled`, and the task is `running` again, its aggregation job withdrawn (the one calling
  this is refused when it reports). When the share ends again, report.lua counts it anew, and
  the aggregation is enqueued once every share is counted again (docs/design/partitions.md, reconciliation).

  KEYS[1] task:<id>        hash   the home record
  KEYS[2] task:<id>:shards hash   of this task (the aggregation job's state)
  KEYS[3] active           hash   ref -> token of its holder (the aggregation job)
  KEYS[4] delayed          zset   ref -> due time (ms)
  KEYS[5] events           stream the event log
  KEYS[6] meta             hash   queue metadata (cancels, events_maxlen)
  KEYS[7] stalled          set    stall candidates of the last sweep
  ARGV[1] key prefix  `{P:Q}:` (the home's)
  ARGV[2] task id
  ARGV[3] the home record's incarnation id (`inc`) the aggregation read
  ARGV[4] partition p
  ARGV[5] the token of the aggregation's claim: only the aggregation that holds the job forgets

  Returns 1 forgotten, 0 nothing to forget (another incarnation, not aggregating, not counted,
  or the caller no longer holds the aggregation job).

  include: events, finish, lanes
]]
local prefix, tid, inc, p = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local t = rcall('HMGET', K.task, 'inc', 'state', 'part:' .. p, 'seq')
if (t[1] or t[4]) ~= inc or t[2] ~= 'aggregating' or not t[3] then return 0 end
local aref = tid .. ':' .. t[4] .. ':agg'
if rcall('HGET', K.active, aref) ~= ARGV[5] then return 0 end
-- read first: the lane the aggregation job may leave
touch_task_lane(prefix, tid)
local d, f, c = share_count(t[3])
rcall('HINCRBY', K.task, 'done', 0 - d)
rcall('HINCRBY', K.task, 'failed', 0 - f)
if c > 0 then rcall('HINCRBY', K.task, 'cancelled', 0 - c) end
rcall('HDEL', K.task, 'part:' .. p, 'round:' .. p)
withdraw_aggregation(prefix, tid, aref)
emit('event', 'share_uncounted', 'task', tid, 'partition', p, 'done', d, 'failed', f)
return 1
