--[[
  Runs a task's failed shards again: each failed shard loses its terminal bit and its reason,
  gets a fresh set of attempts (numbered on from the task's `attempts`) and goes back to its lane
  (a routed task's to `reroute`, placed by the current ring); `failed` drops by as many and the
  task is `running` again, so aggregation follows once every shard is terminal. A task whose
  shards all completed but whose aggregation failed runs its aggregation again. A finished task
  stops expiring. `retried_ms` records when (a waiter's time counts from it). A task that halted
  (failed fast, docs/design/failure-policies.md) also runs again the shards the halt left
  unfinished (handed out, not terminal), and goes back to its runnable set (or `unrouted`) for
  those never handed out.

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
  KEYS[18] unrouted           zset   routed tasks not fully placed
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] (a share of a partitioned task) the home's new round: the share takes it, and a share
          already in that round (or a later one) is not retried again (returns 0)

  Returns how many shards (or 1 for the aggregation) go again: 0 when nothing failed, or -3
  (task missing), -9 (task cancelled), -10 (its results were not kept: aggregation would miss
  them), -13 (it met its --success-when: nothing to retry but a failed aggregation).

  include: chunked, clock, events, finish, hold, lanes, task
]]
local prefix, tid, now = ARGV[1], ARGV[2], now_ms()
local tkey = K.task
local t = rcall('HMGET', tkey, 'state', 'keep_results', 'failed', 'agg_error', 'round', 'halted', 'cancelled')
local state = t[1]
if not state then return -3 end
-- every refusal before the first write (the round below is one)
if state == 'cancelled' then return -9 end
-- a task that met its `success_when` met its goal (docs/design/failure-policies.md): only a
-- failed aggregation of it runs again
local settled = t[7] ~= false
-- (a settled share behind its home's round, a retry cut short before the settle, only takes the
-- round below: its count is then reported in it)
if settled and not ARGV[3] and not (state == 'failed' and t[4]) then return -13 end
local ended = state == 'completed' or state == 'failed'
if ended and t[2] == '0' then return -10 end
if ARGV[3] then
  if tonumber(t[5] or '0') >= tonumber(ARGV[3]) then return 0 end
  -- read first: the share's other keys (an abort at a key of a slot being migrated writes
  -- nothing), then the round, whatever follows: with nothing to run again, the share's counts
  -- are reported again in the new round
  touch_task(prefix, tid)
  rcall('HSET', tkey, 'round', ARGV[3])
  -- a share's handler asked its home to halt in the round before: not in this one
  rcall('HDEL', tkey, 'halt_asked')
end

local again = {}
for _, idx in ipairs(settled and {} or rcall('HKEYS', task_key(prefix, tid, ':errors'))) do
  -- a reason without the terminal bit belongs to a shard still retrying
  if rcall('GETBIT', task_key(prefix, tid, ':terminal'), idx) == 1 then again[#again + 1] = idx end
end
-- a halted task: also its shards handed out and left unfinished, the zero bits of its terminal
-- bitmap below its cursor (`routed` for a routed task); a bit past the bitmap's end is zero
local unfinished = {}
local h = t[6] and state == 'failed' and rcall('HMGET', tkey, 'strategy', 'cursor', 'routed', 'total')
if h then
  local bound = tonumber((h[1] == 'pull' and h[2]) or h[3] or '0')
  local tk = task_key(prefix, tid, ':terminal')
  local bits = rcall('STRLEN', tk) * 8
  local from = 0
  while from < bound do
    local p = from
    if from < bits then
      p = rcall('BITPOS', tk, 0, from, bits - 1, 'BIT')
      if p == -1 then p = bits end
    end
    if p >= bound then break end
    unfinished[#unfinished + 1] = tostring(p)
    from = p + 1
  end
end
local agg_again = #again == 0 and #unfinished == 0 and state == 'failed' and t[4] ~= false
if #again == 0 and #unfinished == 0 and not agg_again then return 0 end
-- read first: the lane its shards or its aggregation job go to
touch_task_lane(prefix, tid)
rcall('HSET', tkey, 'retried_ms', now)

if ended then reopen_ended(prefix, tid) end
if h then
  -- runnable again for the shards never handed out; the limit counts anew
  rcall('HDEL', tkey, 'halted')
  local total = tonumber(h[4])
  if h[1] == 'pull' and tonumber(h[2]) < total then
    local p = rcall('HMGET', tkey, 'priority', 'seq', 'kind')
    lane_add_task(prefix, p[3], tid, tonumber(p[1] or '0'), tonumber(p[2]))
  elseif h[1] ~= 'pull' and tonumber(h[3] or '0') < total then
    rcall('ZADD', K.unrouted, now, tid)
  end
end
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
-- past the highest attempt a handler saw, should deferrals or stalls have passed `attempts`
local attempts = math.max(tonumber(rcall('HGET', tkey, 'attempts') or '1') * retries, tonumber(rcall('HGET', tkey, 'attempt_hw') or '0'))
local pre = tid .. ':' .. rcall('HGET', tkey, 'seq') .. ':'
local skey = shards_key(prefix, tid)
for _, idx in ipairs(again) do
  rcall('SETBIT', task_key(prefix, tid, ':terminal'), idx, 0)
end
for _, list in ipairs({ again, unfinished }) do
  for _, idx in ipairs(list) do
    drop_state(prefix, tid, idx)
    requeue(prefix, pre .. idx, false)
    rcall('HSET', skey, idx .. ':attempt', attempts)
  end
  -- an unfinished shard's reason is that of an attempt before the halt
  if #list > 0 then call_chunked('HDEL', task_key(prefix, tid, ':errors'), list) end
end
-- (only when there is one: Lua's -0 is "-0" to Redis, which no HINCRBY takes)
if #again > 0 then rcall('HINCRBY', tkey, 'failed', -#again) end
rcall('HDEL', tkey, 'first_failure')
emit('event', 'task_retried', 'task', tid, 'shards', #again + #unfinished)
return #again + #unfinished
