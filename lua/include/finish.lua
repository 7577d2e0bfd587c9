--[[
  The end of shards and tasks: terminal marks counted once, the aggregation enqueued, a task
  ended, reopened, or its aggregation withdrawn; a reason's line shown.

  include: task, lanes, events
]]
-- The last line of `reason` that is not blank, nor a stack's frame, nor Node's version line,
-- cut to at most 300 bytes on a UTF-8 boundary: a traceback's last line names its exception, its
-- first says nothing; a stack's message comes before its frames.
local function last_line(reason)
  local last = reason or ''
  for line in string.gmatch(last, '[^\n]+') do
    -- a stack's frames (`    at f (file:1:2)`, after its message) and the version Node prints
    -- after a crash's stack name no failure
    if string.find(line, '%S') and not string.find(line, '^%s+at .+:%d+:%d+%)?%s*$')
      and not string.find(line, '^Node%.js v%d') then
      last = line
    end
  end
  local n = 300
  if #last <= n then return last end
  -- a continuation byte (10xxxxxx) right after the cut: its character would be cut in two
  while n > 0 and string.byte(last, n + 1) >= 128 and string.byte(last, n + 1) < 192 do n = n - 1 end
  return string.sub(last, 1, n)
end

-- Why task `tid` failed fast past its limit: its failed count (`failed`, or its record's), its
-- total and limit, and its first failure (`first`, `<index> <line>`, or its record's).
local function fast_reason(prefix, tid, failed, first)
  local t = rcall('HMGET', task_key(prefix, tid, ''), 'failed', 'total', 'max_failures', 'first_failure')
  first = first or t[4]
  local why = 'failed fast: ' .. (failed or t[1]) .. ' of ' .. t[2] .. ' shards failed for good (limit ' .. (t[3] or '?') .. ')'
  if first then why = why .. '; first: shard ' .. first end
  return why
end

-- A share's count in its home record (`part:<p>`, lua/report.lua): done, failed and, for a share
-- settled as its home ordered, cancelled (`<done>/<failed>[/<cancelled>]`).
local function share_count(v)
  local d, f, c = string.match(v, '^(%d+)/(%d+)/?(%d*)$')
  return tonumber(d), tonumber(f), tonumber(c) or 0
end

-- Enqueues the aggregation job of a task whose every shard is terminal (`c`: its done, failed
-- and seq).
local function enqueue_aggregation(prefix, tid, done, failed, seq, now)
  local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
  touch_lane(prefix, kind)
  rcall('HSET', task_key(prefix, tid, ''), 'state', 'aggregating', 'aggregating_ms', now)
  lane_push(prefix, kind, { tid .. ':' .. seq .. ':agg' }, true)
  emit('event', 'task_aggregating', 'task', tid, 'done', done, 'failed', failed)
end

-- Enqueues the aggregation job if the task's counts say every shard is terminal. A share of a
-- partitioned task (it has `part`) is counted one level up instead (docs/design/partitions.md): it
-- waits in `unreported` until report.lua in the home has counted it
-- and ack.lua removed it. Its keys stay until its home record is removed (the aggregation reads
-- them; `partition::drop_orphans` removes them then).
local function maybe_aggregate(prefix, tid, now)
  local tkey = task_key(prefix, tid, '')
  local c = rcall('HMGET', tkey, 'done', 'failed', 'total', 'seq', 'part')
  if tonumber(c[1]) + tonumber(c[2]) ~= tonumber(c[3]) then return end
  if c[5] then
    rcall('HSET', tkey, 'state', 'aggregating', 'aggregating_ms', now)
    rcall('ZADD', K.unreported, now, tid)
    return
  end
  enqueue_aggregation(prefix, tid, c[1], c[2], c[4], now)
end

-- Marks shard `idx` of a task terminal and counts it in `field` ('done' or 'failed'), once:
-- SETBIT returns the old bit, so a second finish of the same shard counts nothing.
-- Stores `value` in the task's `suffix` hash ('results' or 'errors') when given.
-- Enqueues the aggregation job when this was the last shard. Returns 1 if counted, 0 if not, 2
-- if counted as failed past the task's `max_failures`, or with `halting` (a handler's
-- `fail_task`): the caller then halts the task (lua/include/halt.lua), which never aggregates.
local function mark_terminal(prefix, tid, idx, field, suffix, value, now, halting)
  local tkey = task_key(prefix, tid, '')
  -- an index past the total belongs to an earlier task under the same id: never counted
  if idx >= tonumber(rcall('HGET', tkey, 'total') or '0') then return 0 end
  if rcall('SETBIT', task_key(prefix, tid, ':terminal'), idx, 1) == 1 then return 0 end
  local count = rcall('HINCRBY', tkey, field, 1)
  if value and value ~= '' then
    rcall('HSET', task_key(prefix, tid, ':' .. suffix), idx, value)
  end
  if field == 'done' then
    -- a completed shard may have left a reason from an earlier failed attempt
    rcall('HDEL', task_key(prefix, tid, ':errors'), idx)
  else
    emit('event', 'shard_failed', 'task', tid, 'shard', idx, 'reason', value)
    -- the first failure, for the reasons shown (its last line: a traceback's first says nothing)
    if count == 1 then rcall('HSET', tkey, 'first_failure', idx .. ' ' .. last_line(value)) end
    -- past its limit the task halts (docs/design/failure-policies.md): the caller does it, once
    -- the failing ref's own writes are done; it never aggregates
    local limit = tonumber(rcall('HGET', tkey, 'max_failures') or '')
    if halting or (limit and count > limit) then return 2 end
  end
  maybe_aggregate(prefix, tid, now)
  return 1
end

-- Ends a task in `state` (completed, failed, cancelled): it leaves `running` for `finished`, its
-- per-shard results go unless it keeps them, and its keys expire after its retention.
local function end_task(prefix, tid, state, now)
  local tkey = task_key(prefix, tid, '')
  rcall('HSET', tkey, 'state', state, 'finished_ms', now)
  rcall('ZREM', K.running, tid)
  rcall('ZADD', K.finished, now, tid)
  local r = rcall('HMGET', tkey, 'keep_results', 'retain_ms')
  if r[1] == '0' then rcall('DEL', task_key(prefix, tid, ':results')) end
  local retain = tonumber(r[2] or '0')
  if retain > 0 then
    for _, k in ipairs(task_keys(prefix, tid)) do rcall('PEXPIRE', k, retain) end
    rcall('ZADD', K.expiring, now + retain, tid)
  end
  emit('event', 'task_' .. state, 'task', tid)
end

-- Makes an ended task (completed or failed) run again (retry.lua, reopen.lua): back to
-- `running`, its result gone, its keys kept past its retention.
local function reopen_ended(prefix, tid)
  local tkey = task_key(prefix, tid, '')
  rcall('HSET', tkey, 'state', 'running')
  rcall('HDEL', tkey, 'finished_ms', 'result', 'agg_error')
  rcall('ZREM', K.finished, tid)
  rcall('ZREM', K.expiring, tid)
  -- a share (ended as its home, end_share.lua) runs while its home does, not in `running`
  if rcall('HEXISTS', tkey, 'part') == 0 then rcall('ZADD', K.running, rcall('HGET', tkey, 'created_ms'), tid) end
  for _, k in ipairs(task_keys(prefix, tid)) do rcall('PERSIST', k) end
end

-- Takes back an aggregating task's aggregation job `aref` (retry.lua, reopen.lua): it runs
-- again, so the queued job leaves its lane (the retried shards enqueue a new one) and the running
-- one loses its lock, so that its result, read before the retry, cannot end the task (its
-- executor stops it at the next heartbeat).
local function withdraw_aggregation(prefix, tid, aref)
  local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
  touch_lane(prefix, kind)
  rcall('HSET', task_key(prefix, tid, ''), 'state', 'running')
  rcall('LREM', lane_key(prefix, kind, 'wait'), 0, aref)
  rcall('ZREM', K.delayed, aref)
  if rcall('HDEL', K.active, aref) == 1 then
    rcall('SREM', K.stalled, aref)
    rcall('HINCRBY', K.meta, 'cancels', 1)
  end
  drop_state(prefix, tid, 'agg')
end

-- Ends a task's aggregation: records the result (or the aggregation's failure) once.
local function finish_task(prefix, tid, ok, value, now)
  local tkey = task_key(prefix, tid, '')
  if rcall('HGET', tkey, 'state') ~= 'aggregating' then return 0 end
  local f = rcall('HMGET', tkey, 'failed', 'cancelled', 'success_when', 'done')
  local state = 'completed'
  -- a task that met its goal of k successes (settled, or reached it with its last shard)
  -- completes whatever failed before (k-of-n)
  local met = f[2] or (f[3] and tonumber(f[4]) >= tonumber(f[3]))
  if not ok or (tonumber(f[1]) > 0 and not met) then state = 'failed' end
  if ok then
    rcall('HSET', tkey, 'result', value)
  else
    rcall('HSET', tkey, 'agg_error', value)
  end
  end_task(prefix, tid, state, now)
  -- over partitions: its shares are ended as their home by the partition upkeep, which finds
  -- the task in the home's `unreported` (docs/design/partitions-repair.md, End)
  if rcall('HEXISTS', tkey, 'partitions') == 1 then rcall('ZADD', K.unreported, now, tid) end
  return 1
end
