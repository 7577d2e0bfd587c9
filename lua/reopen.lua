--[[
  Reopens the home record of a task over partitions for `retry` (docs/design/partitions.md): raises its `round`, forgets the counts of the shares given or chosen (their
  `part:<p>` fields go and their counts leave `done` and `failed`), and makes it `running` again.
  The caller then retries every share not counted in the home in its partition, after setting
  its `round` to the one returned; a report of the round before is refused from now on. A retry cut short after this script is
  completed by the next `retry` or by the reconciliation (a share ended in an older round than
  its home's, its count missing, is retried then).

  KEYS[1]  task:<id>          hash   the home record
  KEYS[2]  task:<id>:terminal bitmap of this task (its retention lifted)
  KEYS[3]  task:<id>:results  hash   of this task
  KEYS[4]  task:<id>:errors   hash   of this task
  KEYS[5]  task:<id>:keys     hash   of this task
  KEYS[6]  task:<id>:shards   hash   of this task
  KEYS[7]  active             hash   ref -> token of its holder
  KEYS[8]  delayed            zset   ref -> due time (ms)
  KEYS[9]  events             stream the event log
  KEYS[10] expiring           zset   ended tasks with a retention, by expiry time
  KEYS[11] finished           zset   ended tasks, by end time
  KEYS[12] meta               hash   queue metadata (cancels, events_maxlen)
  KEYS[13] running            zset   tasks not finished
  KEYS[14] stalled            set    stall candidates of the last sweep
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] the round to reopen to, 0 for the next one. A round given is a repair: a share
          reported from a round ahead of its home's (the home's master lost this reopen, its
          shares kept their retry); a home already at that round or past it is left as it is
  ARGV[4..] the partitions whose shares run again; none: every share counted with failed
          shards, chosen here, atomically with the counts (a share counted between the
          caller's read and this call is not missed)

  With no count to forget, a running task only takes a new round (its shares still running
  retry their failed shards in it); a task in any other state is left as it is (returns 0):
  reopened, it would have nothing to run and nothing to end it.

  A halted task (failed fast, docs/design/failure-policies.md) is reopened even with no count to
  forget, its reason gone; a settled one (k-of-n) is refused.

  Returns the new round, 0 (nothing to forget), or -3 (task missing), -9 (task cancelled), -10
  (its results were not kept), -13 (settled), -12 (its partitions are no longer the queue's: a change of the
  layout since it ran; no executor would serve its shares, docs/design/partitions-repair.md).

  include: clock, events, finish, lanes
]]
local prefix, tid, now, to = ARGV[1], ARGV[2], now_ms(), tonumber(ARGV[3])
local tkey = K.task
local t = rcall('HMGET', tkey, 'state', 'keep_results', 'seq', 'partition_tags', 'round', 'halted', 'cancelled')
local state = t[1]
if not state then return -3 end
if state == 'cancelled' then return -9 end
-- settled (k-of-n): its cancelled shards never run again (its aggregation alone may: retry.lua)
if t[7] then return -13 end
if to > 0 and to <= tonumber(t[5] or '0') then return 0 end
if t[4] ~= (rcall('HGET', K.meta, 'partition_tags') or '') then return -12 end
local ended = state == 'completed' or state == 'failed'
if ended and t[2] == '0' then return -10 end
local forget = {}
if #ARGV >= 4 then
  for i = 4, #ARGV do
    local v = rcall('HGET', tkey, 'part:' .. ARGV[i])
    if v then forget[#forget + 1] = { ARGV[i], v } end
  end
else
  for p = 1, tonumber(rcall('HGET', tkey, 'partitions') or '0') do
    local v = rcall('HGET', tkey, 'part:' .. p)
    if v and select(2, share_count(v)) > 0 then forget[#forget + 1] = { p, v } end
  end
end
-- a halted task (failed fast) runs again even with no count to forget: its shares, halted before
-- they were counted, rerun their failed and unfinished shards (the limit counts anew)
if #forget == 0 and state ~= 'running' and not t[6] then return 0 end
-- read first: the lane the aggregation job may leave
touch_task_lane(prefix, tid)
local round = to
if to > 0 then rcall('HSET', tkey, 'round', to) else round = rcall('HINCRBY', tkey, 'round', 1) end
local again = 0
for _, pv in ipairs(forget) do
  local d, f = share_count(pv[2])
  rcall('HINCRBY', tkey, 'done', 0 - d)
  rcall('HINCRBY', tkey, 'failed', 0 - f)
  again = again + f
  rcall('HDEL', tkey, 'part:' .. pv[1], 'round:' .. pv[1])
end
rcall('HSET', tkey, 'retried_ms', now)
rcall('HDEL', tkey, 'halted', 'first_failure')
if ended then
  reopen_ended(prefix, tid)
elseif state == 'aggregating' then
  withdraw_aggregation(prefix, tid, tid .. ':' .. t[3] .. ':agg')
end
emit('event', 'task_retried', 'task', tid, 'shards', again, 'round', round)
return round
