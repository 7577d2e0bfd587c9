--[[
  Creating a task's record (dispatch, fire, layout).

  include: task, lanes, events
]]
-- How long a dispatch over partitions holds its home record before a missing share may be taken
-- as lost (common::incarnation::DISPATCH_LEASE).
local DISPATCH_LEASE_MS = 30000

-- The longest duration a task may carry (common::time::MAX_DURATION: 100 years).
local MAX_DURATION_MS = 3153600000000

-- Creates task `tid` from its hash fields (a flat field, value list): see dispatch.lua. Returns
-- 1, -4 (task exists) or -8 (invalid spec).
local function create_task(prefix, tid, now, priority, start, fields)
  local tkey = task_key(prefix, tid, '')
  if rcall('EXISTS', tkey) == 1 then return -4 end
  -- a home record over partitions: only over the queue's current ones
  -- (docs/design/partitions-repair.md), so that no share lies in a partition a change retired
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'partition_tags' and fields[i + 1] ~= (rcall('HGET', K.meta, 'partition_tags') or '') then
      return -12
    end
  end
  -- checked before any write (no script fails after its first): the terminal bitmap addresses
  -- 2^32 bits; |priority| <= 10^6 keeps the score below 2^53; a duration is at most 100 years
  -- (common::time::MAX_DURATION), so `now` plus it is an exact integer PEXPIRE takes
  if math.abs(priority) > 1000000 or start - now > MAX_DURATION_MS then return -8 end
  local kind
  for i = 1, #fields - 1, 2 do
    local f, v = fields[i], tonumber(fields[i + 1])
    if f == 'total' and (not v or v > 4294967296) then return -8 end
    if (f == 'retain_ms' or f == 'shard_timeout_ms') and (not v or v < 0 or v > MAX_DURATION_MS) then return -8 end
    if f == 'kind' then kind = fields[i + 1] end
  end
  -- a kind is a name (common::names): it becomes part of its lane's keys
  if not kind or not string.match(kind, '^[A-Za-z0-9._-]+$') or #kind > 64 then return -8 end
  -- read first: its lane, written last (docs/design/declared-keys.md, order of writes)
  touch_lane(prefix, kind)
  -- whatever an earlier incarnation of this id left (its keys expire one by one, or an abort
  -- part-way left some): never part of the new task. `:keys` is the dispatcher's, written first.
  rcall('HDEL', K.held, tid, 'u:' .. tid)
  rcall('DEL', task_key(prefix, tid, ':terminal'), task_key(prefix, tid, ':results'), task_key(prefix, tid, ':errors'), task_key(prefix, tid, ':shards'))
  local nonce
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'nonce' then nonce = fields[i + 1] end
  end
  if not nonce then
    local t = rcall('TIME')
    nonce = t[1] .. t[2]
  end
  rcall('HSET', tkey, 'state', 'running', 'cursor', 0, 'done', 0, 'failed', 0, 'created_ms', now, unpack(fields))
  local seq = rcall('HINCRBY', K.meta, 'seq', 1)
  -- `inc`: the incarnation no rollback of this slot reissues (docs/design/partitions.md); `seq`
  -- orders and names refs within the slot
  rcall('HSET', tkey, 'seq', seq, 'inc', seq .. '.' .. nonce)
  rcall('HDEL', tkey, 'nonce')
  -- an earlier task under this id whose keys expired may still be listed as ended
  rcall('ZREM', K.expiring, tid)
  rcall('ZREM', K.finished, tid)
  local shape = rcall('HMGET', tkey, 'strategy', 'part', 'partitions')
  rcall('ZADD', K.index, now, tid)
  -- a share of a partitioned task runs while its home record does (in the home's `running`)
  if not shape[2] then rcall('ZADD', K.running, now, tid) end
  local home = shape[3] ~= false
  if home then
    -- the home record of a partitioned task: its shards are claimed from its shares, which
    -- its dispatcher creates under this lease (renewed by dispatch_lease.lua)
    rcall('HSET', tkey, 'cursor', rcall('HGET', tkey, 'total'), 'round', 0, 'dispatch_until', now + DISPATCH_LEASE_MS, 'dispatcher', nonce)
  end
  local pull = shape[1] == 'pull'
  if not pull then
    -- routed: placed chunk by chunk (route.lua) by the dispatcher or, if it dies, a rebalancer
    rcall('HSET', tkey, 'cursor', rcall('HGET', tkey, 'total'), 'routed', 0)
  end
  if start > now then
    rcall('HSET', tkey, 'state', 'delayed', 'start_ms', start)
    rcall('ZADD', K.scheduled, start, tid)
    rcall('ZADD', K.marker, 'LT', start, 'delayed')
  elseif home then
    -- nothing to claim here: its shares are runnable in their partitions
  elseif pull then
    lane_add_task(prefix, rcall('HGET', tkey, 'kind'), tid, priority, seq)
  else
    rcall('ZADD', K.unrouted, now, tid)
  end
  local t = rcall('HMGET', tkey, 'kind', 'total')
  emit('event', 'task_dispatched', 'task', tid, 'seq', seq, 'kind', t[1], 'total', t[2])
  return 1
end
