--[[
  Shared helpers, prepended to every script that needs them (see common/src/scripts.rs).
  Not an operation by itself.

  Error codes (mirrored by common::ScriptCode):
    -1  lock missing    the shard's lock expired or was never taken
    -2  lock mismatch   another claim holds the lock (stale holder)
    -3  task missing    the task was removed while the shard ran
    -4  task exists     dispatch of an id already in use
    -5  node alive      another live executor holds this node id
    -6  route moved     the task's placement cursor moved: read it again
    -7  head changed    a list no longer starts with the refs read: read it again
]]
local rcall = redis.call

-- Splits a shard ref `<task>:<index>` (or `<task>:agg`) at its last colon.
local function split_ref(ref)
  return string.match(ref, '^(.+):([^:]+)$')
end

-- Takes the lock of a shard away from its holder. 0 when `token` held it, else an error code.
local function take_lock(lock_key, token)
  local cur = rcall('GET', lock_key)
  if not cur then return -1 end
  if cur ~= token then return -2 end
  rcall('DEL', lock_key)
  return 0
end

-- Wakes one blocked executor; the claim script passes the wake-up along while work remains.
local function wake(prefix)
  rcall('ZADD', prefix .. 'marker', 0, '0')
end

-- Marks shard `idx` of a task terminal and counts it in `field` ('done' or 'failed'), once:
-- SETBIT returns the old bit, so a second finish of the same shard counts nothing.
-- Stores `value` in the task's `suffix` hash ('results' or 'errors') when given.
-- Enqueues the aggregation job when this was the last shard. Returns 1 if counted, 0 if not.
local function mark_terminal(prefix, tid, idx, field, suffix, value, now)
  local tkey = prefix .. 'task:' .. tid
  if rcall('SETBIT', tkey .. ':terminal', idx, 1) == 1 then return 0 end
  rcall('HINCRBY', tkey, field, 1)
  if value and value ~= '' then
    rcall('HSET', tkey .. ':' .. suffix, idx, value)
  end
  if field == 'done' then
    -- a completed shard may have left a reason from an earlier failed attempt
    rcall('HDEL', tkey .. ':errors', idx)
  end
  local c = rcall('HMGET', tkey, 'done', 'failed', 'total')
  if tonumber(c[1]) + tonumber(c[2]) == tonumber(c[3]) then
    rcall('HSET', tkey, 'state', 'aggregating', 'aggregating_ms', now)
    rcall('LPUSH', prefix .. 'wait', tid .. ':agg')
    wake(prefix)
  end
  return 1
end

-- Ends a task's aggregation: records the result (or the aggregation's failure) once.
local function finish_task(prefix, tid, ok, value, now)
  local tkey = prefix .. 'task:' .. tid
  if rcall('HGET', tkey, 'state') ~= 'aggregating' then return 0 end
  local failed = tonumber(rcall('HGET', tkey, 'failed'))
  local state = 'completed'
  if not ok or failed > 0 then state = 'failed' end
  if ok then
    rcall('HSET', tkey, 'result', value)
  else
    rcall('HSET', tkey, 'agg_error', value)
  end
  rcall('HSET', tkey, 'state', state, 'finished_ms', now)
  return 1
end
