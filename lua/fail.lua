--[[
  Records failed attempts of claimed shards (and aggregation jobs), each only if its token still
  holds it. With attempts left the ref waits in `delayed` for its backoff; otherwise it is
  terminal and counted as failed with its reason (an aggregation job fails its task).

  KEYS[1]  active     hash   ref -> token
  KEYS[2]  stalled    set
  KEYS[3]  delayed    zset   ref -> due time
  KEYS[4]  events     stream the event log
  KEYS[5]  expiring   zset   ended tasks with a retention, by expiry time
  KEYS[6]  finished   zset   ended tasks, by end time
  KEYS[7]  marker     zset   wakes blocked executors
  KEYS[8]  meta       hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[9]  running    zset   tasks not finished
  KEYS[10] kinds      set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[11] unreported zset   (a partition's) shares ended, not yet counted in the home
  KEYS[12] held       hash   held index shards per task and group (lua/include/fair.lua)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] node        the failing executor's node: a routed shard's retry goes back to it
  ARGV[3..] groups of 5: ref, token, attempt (of this claim), delay_ms (backoff before the next
            attempt), reason

  Refs are `<task>:<seq>:<index>`: one of another incarnation, or outside the task, is refused
  (-3) and let go, nothing recorded.

  Returns one code per group: 2 retry scheduled, 1 failed for good (counted), 0 failed for good
  but already terminal, -1 lock missing, -2 lock mismatch, -3 task missing.

  include: clock, events, fair, finish, hold, lanes, task
]]
local prefix, now, node = ARGV[1], now_ms(), ARGV[2]
local codes = {}
for i = 3, #ARGV, 5 do
  local ref, token, attempt, delay, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4]
  -- a failed shard always has a reason: `retry` finds the failed shards by it
  if reason == '' then reason = 'failed' end
  local code = holds(ref, token)
  if code == 0 then
    local tid, inc, idx = split_ref(ref)
    local tkey = tid and task_key(prefix, tid, '')
    local t = rcall('HMGET', tkey, 'attempts', 'seq', 'total', 'strategy')
    local max = tonumber(t[1] or '0')
    if not tid or t[2] ~= inc or (idx ~= 'agg' and not (tonumber(idx) and tonumber(idx) < tonumber(t[3]))) then
      -- another incarnation's shard (or one outside the task): let go, nothing recorded
      code = -3
    else
      -- read first: an abort at a key of a slot being migrated leaves this shard held, unrecorded
      touch_task(prefix, tid)
      local skey = shards_key(prefix, tid)
      local fails = rcall('HINCRBY', skey, idx .. ':fails', 1)
      if fails < max then
        rcall('HSET', skey, idx .. ':attempt', attempt)
        if idx ~= 'agg' and t[4] ~= 'pull' then rcall('HSET', skey, idx .. ':node', node) end
        if idx ~= 'agg' then rcall('HSET', task_key(prefix, tid, ':errors'), idx, reason) end
        local due = now + delay
        rcall('ZADD', K.delayed, due, ref)
        -- blocked executors learn the due time and wake for it
        rcall('ZADD', K.marker, 'LT', due, 'delayed')
        emit('event', 'shard_retried', 'task', tid, 'shard', idx, 'attempt', attempt, 'reason', reason)
        code = 2
      else
        drop_state(prefix, tid, idx)
        if idx == 'agg' then
          code = finish_task(prefix, tid, false, reason, now)
        else
          code = mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now)
        end
      end
    end
    -- last: the shard leaves `active` (an abort before this leaves it held, for a retry or the sweep)
    rcall('HDEL', K.active, ref)
    rcall('SREM', K.stalled, ref)
    if code ~= -3 and idx ~= 'agg' then unhold(prefix, tid, inc, 1, now) end
  end
  codes[#codes + 1] = code
end
return codes
