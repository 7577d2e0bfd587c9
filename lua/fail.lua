--[[
  Records failed attempts of claimed shards (and aggregation jobs), each only if its token still
  holds it, by the class its handler gave it (docs/design/failure-policies.md): `r` retried
  after its backoff while attempts are left, else terminal and counted as failed with its reason
  (an aggregation job fails its task); `p` terminal now; `a` (retry after) due after its delay,
  its fail count left as it was (past 100 deferrals, as `r`); `f` terminal now, and its task
  halts. A task whose failures pass its `max_failures` halts (lua/include/halt.lua).

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
  KEYS[13] unrouted   zset   routed tasks not fully placed (a halted one leaves it)
  KEYS[14] routed-nodes set  nodes that may have a routed list (a halted task's refs leave them)
  KEYS[15] reroute    list   recovered and released refs of routed tasks (likewise)
  KEYS[16] backups    hash   ref -> token of the shard's backup attempt
  KEYS[17] leases zset instance -> lease expiry (a backup that takes a shard over must be alive)
  KEYS[18] speculating zset ref -> claim ms of first attempts of tasks with --speculate
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] node        the failing executor's node: a routed shard's retry goes back to it
  ARGV[3..] groups of 6: ref, token, attempt (of this claim), delay_ms (backoff before the next
            attempt, or a retry-after's delay), reason, class (r, p, a, f)

  Refs are `<task>:<seq>:<index>`: one of another incarnation, or outside the task, is refused
  (-3) and let go, nothing recorded.

  Returns one code per group: 2 retry scheduled, 1 failed for good (counted), 0 failed for good
  but already terminal, -1 lock missing, -2 lock mismatch, -3 task missing.

  A shard's failure (to retry, or final and counted) records `<i>:failure` = `<ms> <attempt>
  <node>` in `task:<id>:shards`, for the dashboard's groups (docs/design/dashboard.md).

  A shard with two live attempts (docs/design/speculation.md): a failure to retry (`r`, `a`) of
  either drops that attempt only, the other runs on, nothing recorded (code 2); a final one
  (`p`, `f`, or the last attempt) is the shard's verdict, and the other attempt goes with it.

  include: clock, events, fair, finish, halt, hold, lanes, speculate, task
]]
local prefix, now, node = ARGV[1], now_ms(), ARGV[2]
-- deferrals a shard may have before a retry-after counts as a failure (common::failure)
local MAX_DEFERRALS = 100
local codes = {}
-- whether any shard has a backup attempt (one read per call)
local spec_any = rcall('EXISTS', K.backups) == 1
for i = 3, #ARGV, 6 do
  local ref, token, attempt, delay, reason, class = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4], ARGV[i + 5]
  -- a failed shard always has a reason: `retry` finds the failed shards by it
  if reason == '' then reason = 'failed' end
  local code = holds(ref, token)
  local halt -- why its task halts, once this ref is recorded
  local backup = false -- `token` is the shard's backup attempt's
  if code ~= 0 and spec_any and backup_of(ref) == token then code, backup = 0, true end
  if code == 0 and spec_any and (class == 'r' or class == 'a') and leave_attempt(ref, backup, now) then
    -- its other attempt runs on: this one goes, nothing recorded
    code = 2
  elseif code == 0 then
    local tid, inc, idx = split_ref(ref)
    local tkey = tid and task_key(prefix, tid, '')
    local t = rcall('HMGET', tkey, 'attempts', 'seq', 'total', 'strategy', 'max_failures', 'part')
    local max = tonumber(t[1] or '0')
    if not tid or t[2] ~= inc or (idx ~= 'agg' and not (tonumber(idx) and tonumber(idx) < tonumber(t[3]))) then
      -- another incarnation's shard (or one outside the task): let go, nothing recorded
      code = -3
    else
      -- read first (its lane too: a halt writes it): an abort at a key of a slot being migrated
      -- leaves this shard held, unrecorded
      touch_task(prefix, tid)
      -- a handler's fail_task halts its task; a share's asks its home to (the home decides)
      local fatal = class == 'f' and not t[6]
      if fatal or t[5] then touch_halt(prefix, tid) end
      local skey = shards_key(prefix, tid)
      raise_attempt_hw(prefix, tid, attempt)
      local final = class == 'p' or class == 'f'
      local defer = class == 'a' and rcall('HINCRBY', skey, idx .. ':defers', 1) <= MAX_DEFERRALS
      local fails = defer and tonumber(rcall('HGET', skey, idx .. ':fails') or '0') or rcall('HINCRBY', skey, idx .. ':fails', 1)
      if not final and (defer or fails < max) then
        rcall('HSET', skey, idx .. ':attempt', attempt)
        if idx ~= 'agg' and t[4] ~= 'pull' then rcall('HSET', skey, idx .. ':node', node) end
        if idx ~= 'agg' then
          rcall('HSET', task_key(prefix, tid, ':errors'), idx, reason)
          -- when, at which attempt and where, for the failures' groups (docs/design/dashboard.md)
          rcall('HSET', skey, idx .. ':failure', now .. ' ' .. attempt .. ' ' .. node)
        end
        local due = now + delay
        rcall('ZADD', K.delayed, due, ref)
        -- blocked executors learn the due time and wake for it
        rcall('ZADD', K.marker, 'LT', due, 'delayed')
        emit('event', defer and 'shard_deferred' or 'shard_retried', 'task', tid, 'shard', idx, 'attempt', attempt, 'reason', reason, 'due_ms', due)
        code = 2
      else
        drop_state(prefix, tid, idx)
        if idx == 'agg' then
          code = finish_task(prefix, tid, false, reason, now)
        else
          code = mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now, fatal)
          if code ~= 0 then rcall('HSET', skey, idx .. ':failure', now .. ' ' .. attempt .. ' ' .. node) end
          -- a share asks its home, which decides (coordinator/src/partition/decide.rs): the first ask
          if class == 'f' and t[6] and code == 1 then rcall('HSETNX', tkey, 'halt_asked', idx .. ' ' .. last_line(reason)) end
          if code == 2 and fatal then
            halt = 'failed by its handler: shard ' .. idx .. ' asked to fail the task: ' .. last_line(reason)
          elseif code == 2 then
            halt = fast_reason(prefix, tid)
          end
          if code == 2 then code = 1 end
        end
      end
    end
    -- its other attempt, if any, goes with the verdict (its executor learns it from `cancels`)
    if spec_any and (drop_backup(ref) or backup) then rcall('HINCRBY', K.meta, 'cancels', 1) end
    -- no longer held as a first attempt
    if code ~= -3 and idx ~= 'agg' then spec_forget({ ref }) end
    -- last: the shard leaves `active` (an abort before this leaves it held, for a retry or the sweep)
    rcall('HDEL', K.active, ref)
    rcall('SREM', K.stalled, ref)
    if code ~= -3 and idx ~= 'agg' then unhold(prefix, tid, inc, 1, now) end
    if halt then halt_task(prefix, tid, halt, now) end
  end
  codes[#codes + 1] = code
end
return codes
