--[[
  Counts one partition's ended share of a task in the task's home record, once
  (docs/design/partitions.md): the field `part:<p>` (and `round:<p>`, the round it
  was counted in) is set only by the first report of a round, and only that call adds the
  share's final counts to the home's `done` and `failed` (a count of an older round is replaced). When every
  share is counted the home's counts reach its total and the aggregation job is enqueued in the
  home, once (lib.lua enqueue_aggregation). Repeated by whoever finds the share still in its
  partition's `unreported` (the executor that ended it, then every sweep), so a crash between
  the partition's write and this one loses nothing and counts nothing twice.

  KEYS[1] task:<id> hash   the home record
  KEYS[2] kinds     set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[3] meta      hash   queue metadata (events_maxlen)
  KEYS[4] events    stream the event log
  ARGV[1] key prefix  `{P:Q}:` (the home's)
  ARGV[2] task id
  ARGV[3] the home record's incarnation id (`inc`) the share was dispatched for
  ARGV[4] partition p
  ARGV[5] the home's round the share ran in
  ARGV[6] the share's done
  ARGV[7] the share's failed

  Returns 1 counted, 0 counted before (or for an older round, another incarnation or a state
  that no longer takes it: nothing to count, acknowledge it), 2 the share ran in a round ahead
  of the home's (the home's master lost a `reopen.lua` its shares kept: the caller reopens the
  home to that round for this partition, then reports again), -3 the home record is gone.

  include: clock, events, finish, lanes
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
  local d, f = string.match(counted[1], '^(%d+)/(%d+)$')
  rcall('HINCRBY', K.task, 'done', 0 - tonumber(d))
  rcall('HINCRBY', K.task, 'failed', 0 - tonumber(f))
end
rcall('HSET', K.task, 'part:' .. p, ARGV[6] .. '/' .. ARGV[7], 'round:' .. p, round)
rcall('HINCRBY', K.task, 'done', ARGV[6])
rcall('HINCRBY', K.task, 'failed', ARGV[7])
emit('event', 'share_counted', 'task', tid, 'partition', p, 'done', ARGV[6], 'failed', ARGV[7])
local c = rcall('HMGET', K.task, 'done', 'failed', 'total')
if tonumber(c[1]) + tonumber(c[2]) == tonumber(c[3]) then
  enqueue_aggregation(prefix, tid, c[1], c[2], t[5], now_ms())
end
return 1
