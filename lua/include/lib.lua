--[[
  Shared helpers, prepended to every script (see common/src/scripts.rs). Not an operation.

  Holding a shard: `active` is a hash ref -> token `<instance>:<seq>`; the shard is held by that
  token and no other. Whether its holder is alive is told by the holder's lease: its entry in
  the zset `leases`, scored by its expiry on Redis's clock (TIME + lockDuration), which the
  holder's claims and heartbeats renew. A shard whose holder's lease expired is stalled: the
  sweep, called at the earliest expiry, puts it back.

  Error codes (mirrored by common::ScriptCode):
    -1  lock missing    the shard is no longer held (recovered, or never claimed)
    -2  lock mismatch   another claim holds the shard (stale holder)
    -3  task missing    the task was removed while the shard ran
    -4  task exists     dispatch of an id already in use
    -5  node alive      another live executor holds this node id
    -6  route moved     the task's placement cursor moved: read it again
    -7  head changed    a list no longer starts with the refs read: read it again
    -8  invalid spec    a dispatch outside the limits (over 2^32 shards, |priority| > 10^6)
    -9  task ended      cancel of a finished task, retry of a cancelled one
    -10 results gone    retry of a finished task dispatched with keep_results off
    -11 not due yet     a schedule's fire time is later than Redis's clock
    -12 layout changed  the queue's partitions are no longer the ones the caller read
]]
local rcall = redis.call

--[[
  Keys (ARCHITECTURE.md "Declared keys"). The registry (common/src/scripts.rs) puts a preamble
  before this file, made from the script's header: `K` maps each declared key's name to its key
  (`K.wait`, `K.node_wait` for `node:<n>:wait`, `K.task` for `task:<id>`), in the order of the
  script's KEYS, and raises on a name the header does not declare; `DECLARED` is the set of
  declared key strings; `TASK_ANCHOR` is the declared `task:<id>` of a single-task script, or nil. Queue-level keys are only ever reached
  through `K`. Keys of a task are built by `task_key`: in a single-task script, every key of its
  own task must be declared too; multi-task scripts (claim, complete, ...) derive them from the
  prefix, in the queue's slot. Per-node keys (`node:<n>:*`) are derived the same way.
]]
local function task_key(prefix, tid, suffix)
  local k = prefix .. 'task:' .. tid .. suffix
  if TASK_ANCHOR and TASK_ANCHOR == prefix .. 'task:' .. tid and not DECLARED[k] then
    error('shardctl: key ' .. k .. ' is not declared by this script')
  end
  return k
end

-- The one clock (ARCHITECTURE.md "One clock"): Redis's own, in ms since the epoch. Every time a
-- script stores or compares is read here, never taken from a caller, so that executors,
-- coordinators and dispatchers with skewed clocks agree on leases, due times and membership.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A permanent field of `active` whose value is longer than 64 bytes: it keeps the hash in
-- hashtable encoding (Redis never converts back), where HSET/HDEL cost O(1) per field instead of
-- a scan of a listpack that would be re-created each time the hash empties. Never a ref.
local ACTIVE_PIN = '~pin'
local ACTIVE_PIN_VALUE = 'keeps this hash in hashtable encoding (a value over 64 bytes); not a shard'

-- Splits a shard ref `<task>:<seq>:<index>` (or `<task>:<seq>:agg`): task id, incarnation
-- (the task's `seq`), index. Task ids have no colon (common::names).
local function split_ref(ref)
  return string.match(ref, '^([^:]+):(%d+):([^:]+)$')
end

-- Every key a task owns, as suffixes of `task:<id>` (the same list as Keys::task_keys).
local TASK_SUFFIXES = { '', ':terminal', ':results', ':errors', ':keys', ':shards' }

-- Reads keys of task `tid` (suffixes of `task:<id>`; all of them when none are given, and then
-- its kind's lane too) before a script writes any of them: on a cluster, a key of a slot being
-- migrated that is not here any more aborts the script at this read, before anything was
-- written, instead of part-way (ARCHITECTURE.md "Declared keys", order of writes).
local touch_lane
local function touch_task(prefix, tid, suffixes)
  local ks = {}
  for i, sfx in ipairs(suffixes or TASK_SUFFIXES) do ks[i] = task_key(prefix, tid, sfx) end
  rcall('EXISTS', unpack(ks))
  if not suffixes then
    local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
    if kind then touch_lane(prefix, kind) end
  end
end

-- The hash of a task's per-shard state: `<index>:attempt`, `:fails`, `:stalled`, `:node` (and
-- `agg:*`), only for shards that were claimed more than once, failed, stalled or routed back.
local function shards_key(prefix, tid)
  return task_key(prefix, tid, ':shards')
end

-- Forgets one shard's state.
local function drop_state(prefix, tid, idx)
  rcall('HDEL', shards_key(prefix, tid), idx .. ':attempt', idx .. ':fails', idx .. ':stalled', idx .. ':node')
end

-- True when `ref` belongs to the current incarnation of its task (the task exists and its
-- `seq` is the ref's): anything else is left over from an earlier task under the same id.
local function current(prefix, tid, inc)
  return tid ~= nil and rcall('HGET', task_key(prefix, tid, ''), 'seq') == inc
end

-- Calls `cmd key a1 a2 ...` over a long argument list in chunks (Lua's unpack has a limit).
local function call_chunked(cmd, key, args)
  for s = 1, #args, 4000 do
    rcall(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
  end
end

-- Appends to the event log (best effort, capped); nothing counts from it.
local function emit(...)
  local maxlen = rcall('HGET', K.meta, 'events_maxlen') or '10000'
  if maxlen ~= '0' then
    rcall('XADD', K.events, 'MAXLEN', '~', maxlen, '*', ...)
  end
end

-- Asks for a rebalance soon: routed work waits in `unrouted` or `reroute` for the current ring.
-- The blocked executor that pops this marker rebalances at once instead of at its next
-- membership heartbeat.
local function want_routing()
  rcall('ZADD', K.marker, 0, 'route')
end

-- The score of a runnable task in `tasks`: higher priority first; among equals, first
-- dispatched first (exact: |score| < 2^53 with |priority| <= 10^6 and seq < 2^32).
local function runnable_score(priority, seq)
  return -tonumber(priority) * 4294967296 + tonumber(seq)
end

--[[
  Lanes (ARCHITECTURE.md "Kinds and lanes"): what is ready to claim lives in the lane of its
  task's kind, `kind:<k>:wait` (explicit refs) and `kind:<k>:tasks` (runnable pull tasks), and
  `kind:<k>:marker` wakes the executors that serve k; `kind:*:marker` wakes those that serve
  every kind (`*` is no name character: no kind owns it). `kinds` lists the kinds that may have
  a lane; every push adds its kind, so a claim may drop a kind whose lane is empty. Lane keys are
  derived from the prefix like per-node keys: in the queue's slot, unknown to the caller.
]]
local ANY_KIND_MARKER = 'kind:*:marker'

local function lane_key(prefix, kind, what)
  return prefix .. 'kind:' .. kind .. ':' .. what
end

-- Reads the lane keys of `kind` before a script writes them (see `touch_task`).
touch_lane = function(prefix, kind)
  rcall('EXISTS', lane_key(prefix, kind, 'wait'), lane_key(prefix, kind, 'tasks'), lane_key(prefix, kind, 'marker'), prefix .. ANY_KIND_MARKER)
end

-- Reads the lane keys of task `tid`'s kind (none without a record) before a script writes any
-- key: a single-task script calls it before its first write.
local function touch_task_lane(prefix, tid)
  local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
  if kind then touch_lane(prefix, kind) end
end

-- Wakes one blocked executor that serves `kind`, and one that serves every kind.
local function wake_lane(prefix, kind)
  rcall('ZADD', lane_key(prefix, kind, 'marker'), 0, '0')
  rcall('ZADD', prefix .. ANY_KIND_MARKER, 0, '0')
end

-- Appends refs (a list) to the wait of lane `kind` (at the front when `front`), and wakes it.
local function lane_push(prefix, kind, refs, front)
  rcall('SADD', K.kinds, kind)
  call_chunked(front and 'LPUSH' or 'RPUSH', lane_key(prefix, kind, 'wait'), refs)
  wake_lane(prefix, kind)
end

-- Makes pull task `tid` runnable in lane `kind`, and wakes it.
local function lane_add_task(prefix, kind, tid, priority, seq)
  rcall('SADD', K.kinds, kind)
  rcall('ZADD', lane_key(prefix, kind, 'tasks'), runnable_score(priority, seq), tid)
  wake_lane(prefix, kind)
end

-- Starts delayed tasks whose start time has come (at most 100): a pull task becomes runnable,
-- a routed one waits in `unrouted` for a rebalancer to place it. Returns how many.
local function start_due_tasks(prefix, now)
  local due = rcall('ZRANGEBYSCORE', K.scheduled, '-inf', now, 'LIMIT', 0, 100)
  if #due == 0 then return 0 end
  -- read first: an abort at a key of a slot being migrated leaves the tasks scheduled
  local ts = {}
  for i, tid in ipairs(due) do
    ts[i] = rcall('HMGET', task_key(prefix, tid, ''), 'state', 'strategy', 'priority', 'seq', 'partitions', 'kind')
    if ts[i][6] then touch_lane(prefix, ts[i][6]) end
  end
  call_chunked('ZREM', K.scheduled, due)
  for i, tid in ipairs(due) do
    local t = ts[i]
    if t[1] == 'delayed' then
      rcall('HSET', task_key(prefix, tid, ''), 'state', 'running')
      if t[5] then
        -- the home record of a task over partitions holds no shard: its shares start in their
        -- partitions (each its own delay); nothing to claim or route here
      elseif t[2] == 'pull' then
        lane_add_task(prefix, t[6], tid, t[3], t[4])
      else
        rcall('ZADD', K.unrouted, now, tid)
        want_routing()
      end
      emit('event', 'task_started', 'task', tid)
    end
  end
  return #due
end

-- The earliest due time of a delayed shard or a delayed task, or nil.
local function next_due()
  local a = rcall('ZRANGE', K.delayed, 0, 0, 'WITHSCORES')
  local b = rcall('ZRANGE', K.scheduled, 0, 0, 'WITHSCORES')
  local d = a[2] and tonumber(a[2])
  if b[2] and (not d or tonumber(b[2]) < d) then d = tonumber(b[2]) end
  return d
end

-- Moves due retries from `delayed` (at most 1000): a routed shard's to the list of the node it
-- failed on, the others to their kind's lane; a ref of another incarnation goes. Returns how many.
local function promote_due(prefix, now)
  start_due_tasks(prefix, now)
  local due = rcall('ZRANGEBYSCORE', K.delayed, '-inf', now, 'LIMIT', 0, 1000)
  if #due == 0 then return 0 end
  -- read first (where each goes), then move: an abort at a key of a slot being migrated leaves
  -- every retry in `delayed`
  local nodes, kinds = {}, {}
  for i, ref in ipairs(due) do
    local tid, inc, idx = split_ref(ref)
    local t = tid and rcall('HMGET', task_key(prefix, tid, ''), 'seq', 'kind')
    local node = t and t[1] == inc and rcall('HGET', shards_key(prefix, tid), idx .. ':node')
    if node then
      rcall('EXISTS', prefix .. 'node:' .. node .. ':wait', prefix .. 'node:' .. node .. ':marker')
    elseif t and t[1] == inc and t[2] then
      kinds[i] = t[2]
      touch_lane(prefix, t[2])
    end
    nodes[i] = node
  end
  call_chunked('ZREM', K.delayed, due)
  local plain = {} -- kind -> refs
  for i, ref in ipairs(due) do
    local node = nodes[i]
    if node then
      rcall('RPUSH', prefix .. 'node:' .. node .. ':wait', ref)
      rcall('SADD', K.routed_nodes, node)
      rcall('ZADD', prefix .. 'node:' .. node .. ':marker', 0, '0')
    elseif kinds[i] then
      local l = plain[kinds[i]]
      if not l then
        l = {}
        plain[kinds[i]] = l
      end
      l[#l + 1] = ref
    end
  end
  for kind, refs in pairs(plain) do lane_push(prefix, kind, refs, false) end
  return #due
end

-- Whether `token` holds the shard: 0 when it does, else an error code. The caller removes the
-- shard from `active` after its other writes (an abort part-way then leaves the shard held, and
-- the holder's retry or the sweep finishes the step).
local function holds(ref, token)
  local cur = rcall('HGET', K.active, ref)
  if not cur then return -1 end
  if cur ~= token then return -2 end
  return 0
end

-- Puts a shard taken from its holder back where it can be claimed again: a routed task's shard
-- to `reroute` (the current ring places it), any other to its kind's lane (at the front when
-- `front`).
-- `attempt` is set for a lazily claimed shard, so that the next claim counts it as the second.
-- A ref of another incarnation is not requeued (returns false).
local function requeue(prefix, ref, front)
  local tid, inc, idx = split_ref(ref)
  if not current(prefix, tid, inc) then return false end
  touch_task(prefix, tid, { ':shards' })
  local t = rcall('HMGET', task_key(prefix, tid, ''), 'strategy', 'kind')
  local routed = idx ~= 'agg' and t[1] ~= 'pull'
  if not routed then touch_lane(prefix, t[2]) end
  rcall('HSETNX', shards_key(prefix, tid), idx .. ':attempt', 1)
  if routed then
    rcall('RPUSH', K.reroute, ref)
    want_routing()
  else
    lane_push(prefix, t[2], { ref }, front)
  end
  return true
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
-- partitioned task (it has `part`) is counted one level up instead (ARCHITECTURE.md
-- "Partitioned queues"): it waits in `unreported` until report.lua in the home has counted it
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
-- Enqueues the aggregation job when this was the last shard. Returns 1 if counted, 0 if not.
local function mark_terminal(prefix, tid, idx, field, suffix, value, now)
  local tkey = task_key(prefix, tid, '')
  -- an index past the total belongs to an earlier task under the same id: never counted
  if idx >= tonumber(rcall('HGET', tkey, 'total') or '0') then return 0 end
  if rcall('SETBIT', task_key(prefix, tid, ':terminal'), idx, 1) == 1 then return 0 end
  rcall('HINCRBY', tkey, field, 1)
  if value and value ~= '' then
    rcall('HSET', task_key(prefix, tid, ':' .. suffix), idx, value)
  end
  if field == 'done' then
    -- a completed shard may have left a reason from an earlier failed attempt
    rcall('HDEL', task_key(prefix, tid, ':errors'), idx)
  else
    emit('event', 'shard_failed', 'task', tid, 'shard', idx, 'reason', value)
  end
  maybe_aggregate(prefix, tid, now)
  return 1
end

-- Every key a task owns (the same list as common::keys::Keys::task_keys).
local function task_keys(prefix, tid)
  local ks = {}
  for i, sfx in ipairs(TASK_SUFFIXES) do ks[i] = task_key(prefix, tid, sfx) end
  return ks
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
  local failed = tonumber(rcall('HGET', tkey, 'failed'))
  local state = 'completed'
  if not ok or failed > 0 then state = 'failed' end
  if ok then
    rcall('HSET', tkey, 'result', value)
  else
    rcall('HSET', tkey, 'agg_error', value)
  end
  end_task(prefix, tid, state, now)
  -- over partitions: its shares are ended as their home by the partition upkeep, which finds
  -- the task in the home's `unreported` (ARCHITECTURE.md, "Multi-slot operations", End)
  if rcall('HEXISTS', tkey, 'partitions') == 1 then rcall('ZADD', K.unreported, now, tid) end
  return 1
end

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
  -- a home record over partitions: only over the queue's current ones (ARCHITECTURE.md,
  -- "Changing the layout"), so that no share lies in a partition a change retired
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
  -- read first: its lane, written last (ARCHITECTURE.md "Declared keys", order of writes)
  touch_lane(prefix, kind)
  -- whatever an earlier incarnation of this id left (its keys expire one by one, or an abort
  -- part-way left some): never part of the new task. `:keys` is the dispatcher's, written first.
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
  -- `inc`: the incarnation no rollback of this slot reissues (ARCHITECTURE.md, "One task, one
  -- identity across slots"); `seq` orders and names refs within the slot
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
