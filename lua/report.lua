--[[
  Counts one partition's ended share of a task in the task's home record, once
  (ARCHITECTURE.md "Partitioned queues"): the field `part:<p>` is set with HSETNX, and only the
  call that set it adds the share's final counts to the home's `done` and `failed`. When every
  share is counted the home's counts reach its total and the aggregation job is enqueued in the
  home, once (lib.lua enqueue_aggregation). Repeated by whoever finds the share still in its
  partition's `unreported` (the executor that ended it, then every sweep), so a crash between
  the partition's write and this one loses nothing and counts nothing twice.

  KEYS[1] task:<id> hash    the home record
  KEYS[2] wait      list    explicit refs ready now (the aggregation job)
  KEYS[3] marker    zset    wakes blocked executors
  KEYS[4] meta      hash    queue metadata (events_maxlen)
  KEYS[5] events    stream  the event log
  ARGV[1] key prefix  `{P:Q}:` (the home's)
  ARGV[2] task id
  ARGV[3] the home record's seq the share was dispatched for
  ARGV[4] partition p
  ARGV[5] the home's round the share ran in
  ARGV[6] the share's done
  ARGV[7] the share's failed

  Returns 1 counted, 0 counted before (or for a round, incarnation or state that no longer
  takes it: nothing to count, acknowledge it), -3 the home record is gone.
]]
local prefix, tid, inc, p, round = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local t = rcall('HMGET', K.task, 'seq', 'round', 'state', 'partitions')
if not t[1] then return -3 end
-- a delayed home (`--delay`) counts too: its shares start at about its start time
if t[1] ~= inc or not t[4] or (t[2] or '0') ~= round or (t[3] ~= 'running' and t[3] ~= 'delayed') then return 0 end
if rcall('HSETNX', K.task, 'part:' .. p, ARGV[6] .. '/' .. ARGV[7]) == 0 then return 0 end
rcall('HINCRBY', K.task, 'done', ARGV[6])
rcall('HINCRBY', K.task, 'failed', ARGV[7])
emit('event', 'share_counted', 'task', tid, 'partition', p, 'done', ARGV[6], 'failed', ARGV[7])
local c = rcall('HMGET', K.task, 'done', 'failed', 'total')
if tonumber(c[1]) + tonumber(c[2]) == tonumber(c[3]) then
  enqueue_aggregation(prefix, tid, c[1], c[2], inc, now_ms())
end
return 1
