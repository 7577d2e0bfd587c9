--[[
  Runs a task's failed shards again: each failed shard loses its terminal bit and its reason,
  gets a fresh set of attempts (numbered on from the task's `attempts`) and goes back to its lane
  (a routed task's to `reroute`, placed by the current ring); `failed` drops by as many and the
  task is `running` again, so aggregation follows once every shard is terminal. A task whose
  shards all completed but whose aggregation failed runs its aggregation again. A finished task
  stops expiring. `retried_ms` records when (a waiter's time counts from it).

  KEYS[1]  task:<id>          hash
  KEYS[2]  kinds              set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[3]  task:<id>:terminal bitmap of this task
  KEYS[4]  task:<id>:results  hash   of this task
  KEYS[5]  task:<id>:errors   hash   of this task
  KEYS[6]  task:<id>:keys     hash   of this task
  KEYS[7]  task:<id>:shards   hash   of this task
  KEYS[8]  active             hash   ref -> token of its holder
  KEYS[9]  delayed            zset   ref -> due time (ms)
  KEYS[10] events             stream the event log
  KEYS[11] expiring           zset   ended tasks with a retention, by expiry time
  KEYS[12] finished           zset   ended tasks, by end time
  KEYS[13] marker             zset   wakes blocked executors
  KEYS[14] meta               hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[15] reroute            list   recovered and released refs of routed tasks
  KEYS[16] running            zset   tasks not finished
  KEYS[17] stalled            set    stall candidates of the last sweep
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] (a share of a partitioned task) the home's new round: the share takes it, and a share
          already in that round (or a later one) is not retried again (returns 0)

  Returns how many shards (or 1 for the aggregation) go again: 0 when nothing failed, or -3
  (task missing), -9 (task cancelled), -10 (its results were not kept: aggregation would miss
  them).

  include: chunked, clock, events, finish, hold, lanes, task
]]
local prefix, tid, now = ARGV[1], ARGV[2], now_ms()
local tkey = K.task
local t = rcall('HMGET', tkey, 'state', 'keep_results', 'failed', 'agg_error', 'round')
local state = t[1]
if not state then return -3 end
-- every refusal before the first write (the round below is one)
if state == 'cancelled' then return -9 end
local ended = state == 'completed' or state == 'failed'
if ended and t[2] == '0' then return -10 end
if ARGV[3] then
  if tonumber(t[5] or '0') >= tonumber(ARGV[3]) then return 0 end
  -- read first: the share's other keys (an abort at a key of a slot being migrated writes
  -- nothing), then the round, whatever follows: with nothing to run again, the share's counts
  -- are reported again in the new round
  touch_task(prefix, tid)
  rcall('HSET', tkey, 'round', ARGV[3])
end

local again = {}
for _, idx in ipairs(rcall('HKEYS', task_key(prefix, tid, ':errors'))) do
  -- a reason without the terminal bit belongs to a shard still retrying
  if rcall('GETBIT', task_key(prefix, tid, ':terminal'), idx) == 1 then again[#again + 1] = idx end
end
local agg_again = #again == 0 and state == 'failed' and t[4] ~= false
if #again == 0 and not agg_again then return 0 end
-- read first: the lane its shards or its aggregation job go to
touch_task_lane(prefix, tid)
rcall('HSET', tkey, 'retried_ms', now)

if ended then reopen_ended(prefix, tid) end
local aref = tid .. ':' .. rcall('HGET', tkey, 'seq') .. ':agg'
if agg_again then
  rcall('ZREM', K.delayed, aref)
  drop_state(prefix, tid, 'agg')
  rcall('HSET', tkey, 'state', 'aggregating', 'aggregating_ms', now)
  lane_push(prefix, rcall('HGET', tkey, 'kind'), { aref }, true)
  emit('event', 'task_retried', 'task', tid, 'shards', 0)
  return 1
end
if state == 'aggregating' then withdraw_aggregation(prefix, tid, aref) end
-- fresh attempts: no failure counts against the shard; its attempt numbers go on past those of
-- the rounds before (the n-th retry starts past n × attempts), so that a handler does not see
-- the number of an attempt it already made (the `fail` kind decides by it) and the claim knows
-- the shard has state
local retries = rcall('HINCRBY', tkey, 'retries', 1)
local attempts = tonumber(rcall('HGET', tkey, 'attempts') or '1') * retries
local pre = tid .. ':' .. rcall('HGET', tkey, 'seq') .. ':'
local skey = shards_key(prefix, tid)
for _, idx in ipairs(again) do
  rcall('SETBIT', task_key(prefix, tid, ':terminal'), idx, 0)
  drop_state(prefix, tid, idx)
  requeue(prefix, pre .. idx, false)
  rcall('HSET', skey, idx .. ':attempt', attempts)
end
call_chunked('HDEL', task_key(prefix, tid, ':errors'), again)
rcall('HINCRBY', tkey, 'failed', -#again)
emit('event', 'task_retried', 'task', tid, 'shards', #again)
return #again
