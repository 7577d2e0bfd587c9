--[[
  The stalled-shard sweep. A shard is stalled when its holder is dead: the holder's lease in
  `leases` (instance -> expiry, by Redis TIME) has run out. Two passes:

  - Expired leases, on every call: the held refs of each executor whose lease expired go back at
    once, and its lease entry goes. Callers call again at the earliest expiry this returns, so a
    dead executor's shards are claimable again within a few ms of its lease running out, whatever
    the interval.
  - The full sweep, at most once per interval across all processes (throttled by
    `stalled-check`): Bull's mark-then-confirm for held refs whose holder has no lease entry at
    all (its lease was lost with data of a failed-over server, or removed by hand): confirm the
    refs the last full sweep marked that are still held by a holder without a live lease, then
    mark the held refs whose holder has no entry now.

  A stalled ref goes back to its lane's wait (a routed task's to `reroute`) with its stalled count raised,
  or past max_stalled fails for good with `reason`; a task whose failures then pass its
  `max_failures` halts (lua/include/halt.lua), once the sweep's other writes are done.

  KEYS[1]  stalled-check string PX the throttle of the full sweep
  KEYS[2]  stalled       set    candidates of the last full sweep
  KEYS[3]  active        hash   ref -> token `<instance>:<seq>`
  KEYS[4]  kinds         set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[5]  reroute       list   recovered refs of routed tasks (placed by the current ring)
  KEYS[6]  events        stream the event log
  KEYS[7]  expiring      zset   ended tasks with a retention, by expiry time
  KEYS[8]  finished      zset   ended tasks, by end time
  KEYS[9]  marker        zset   wakes blocked executors
  KEYS[10] meta          hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[11] running       zset   tasks not finished
  KEYS[12] leases        zset   instance -> lease expiry (ms, Redis TIME)
  KEYS[13] unreported    zset   (a partition's) shares ended, not yet counted in the home
  KEYS[14] held          hash   held index shards per task and group: rebuilt from `active`
  KEYS[15] delayed       zset   ref -> due time (a halted task's refs leave it)
  KEYS[16] unrouted      zset   routed tasks not fully placed (a halted one leaves it)
  KEYS[17] routed-nodes  set    nodes that may have a routed list (a halted task's refs leave them)
  KEYS[18] backups hash ref -> token of a shard's backup attempt (docs/design/speculation.md)
  KEYS[19] speculating zset ref -> claim ms of first attempts of tasks with --speculate
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] interval_ms of the full sweep
  ARGV[3] max_stalled   stalls a shard may survive
  ARGV[4] reason        failure reason past the cap

  Returns { ran, recovered, failed, marked, next }: ran is 1 when either pass ran (0: nothing
  expired and the full sweep was throttled), next is how many ms from now the earliest live
  lease expires (-1: none).

  A first attempt whose holder died while its backup attempt's lives (docs/design/speculation.md)
  is not stalled: the backup takes its place in `active`. A backup whose holder died goes.
  A stalled shard leaves `speculating`. A shard failed as stalled records `<i>:failure` (`<ms>
  <attempt> ?`: its node is not known here) for the dashboard's groups (docs/design/dashboard.md).

  include: chunked, clock, events, fair, finish, halt, hold, lanes, task
]]
local prefix, now, interval, max_stalled, reason = ARGV[1], now_ms(), ARGV[2], tonumber(ARGV[3]), ARGV[4]

local function next_expiry()
  local e = rcall('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
  if not e[2] then return -1 end
  return math.max(1, tonumber(e[2]) - now)
end

local expired = rcall('ZRANGEBYSCORE', K.leases, '-inf', now)
local full = rcall('SET', K.stalled_check, now, 'NX', 'PX', interval)
if #expired == 0 and not full then return { 0, 0, 0, 0, next_expiry() } end

-- a holder's lease: 'live', 'expired' or 'none'
local leases = {}
for _, inst in ipairs(expired) do leases[inst] = 'expired' end
local function lease_of(token)
  local inst = string.match(token, '^(.*):[^:]*$') or token
  local l = leases[inst]
  if l == nil then
    local s = rcall('ZSCORE', K.leases, inst)
    l = (s == false and 'none') or (tonumber(s) > now and 'live') or 'expired'
    leases[inst] = l
  end
  return l
end

-- backup attempts (docs/design/speculation.md): ref -> token
local backups = {}
local bk = rcall('HGETALL', K.backups)
for i = 1, #bk, 2 do backups[bk[i]] = bk[i + 1] end

local recovered, failed = 0, 0
local gone = {} -- refs stalled by this call
local halts = {} -- tasks whose failures passed their limit, to halt last
local function stall(ref)
  -- a first attempt whose backup runs on: the backup takes its place, nothing is requeued
  local b = backups[ref]
  -- (a backup with no lease entry at all is taken as alive here: the full sweep's
  -- mark-then-confirm then judges it as the first attempt's holder)
  if b and lease_of(b) ~= 'expired' then
    rcall('HSET', K.active, ref, b)
    rcall('HDEL', K.backups, ref)
    backups[ref] = nil
    return
  end
  local tid, inc, idx = split_ref(ref)
  local mine = current(prefix, tid, inc)
  -- read first: an abort at a key of a slot being migrated leaves this shard held, unrecorded
  if mine then
    touch_task(prefix, tid)
    if rcall('HEXISTS', task_key(prefix, tid, ''), 'max_failures') == 1 then touch_halt(prefix, tid) end
  end
  local attempt
  if mine then
    -- the attempt that stalled was seen by its handler: a retry numbers past it
    attempt = rcall('HGET', shards_key(prefix, tid), idx .. ':attempt') or 1
    raise_attempt_hw(prefix, tid, attempt)
  end
  if not mine then
    -- another incarnation's shard: let go, nothing recorded
  elseif rcall('HINCRBY', shards_key(prefix, tid), idx .. ':stalled', 1) > max_stalled then
    drop_state(prefix, tid, idx)
    if idx == 'agg' then
      finish_task(prefix, tid, false, reason, now)
    else
      local code = mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now, false)
      if code == 2 then halts[#halts + 1] = tid end
      -- when and at which attempt, for the failures' groups (its holder's node is not known here)
      if code ~= 0 then rcall('HSET', shards_key(prefix, tid), idx .. ':failure', now .. ' ' .. attempt .. ' ?') end
    end
    failed = failed + 1
  else
    requeue(prefix, ref, false)
    emit('event', 'shard_stalled', 'task', tid, 'shard', idx)
    recovered = recovered + 1
  end
  -- its backup, if any, went with its holder; it is no longer held as a first attempt
  if b then
    rcall('HDEL', K.backups, ref)
    backups[ref] = nil
  end
  rcall('ZREM', K.speculating, ref)
  -- last: the shard leaves `active` (an abort before this leaves it held, for the next sweep)
  rcall('HDEL', K.active, ref)
  gone[ref] = true
end

if full then
  local candidates = rcall('SMEMBERS', K.stalled)
  rcall('DEL', K.stalled)
  for _, ref in ipairs(candidates) do
    local token = rcall('HGET', K.active, ref)
    if token and lease_of(token) ~= 'live' then stall(ref) end
  end
end

local marked, refs = {}, {}
local held = rcall('HGETALL', K.active)
for i = 1, #held, 2 do
  if held[i] ~= ACTIVE_PIN then refs[#refs + 1] = held[i] end
end
for i = 1, #held, 2 do
  local ref = held[i]
  if ref ~= ACTIVE_PIN then
    local l = lease_of(held[i + 1])
    if l == 'expired' then
      stall(ref)
    elseif l == 'none' and full then
      marked[#marked + 1] = ref
    end
  end
end
if #marked > 0 then call_chunked('SADD', K.stalled, marked) end
-- backup attempts whose holder died go; their first attempt runs on (or was recovered above)
local dead = {}
for ref, token in pairs(backups) do
  local l = lease_of(token)
  if l == 'expired' or (l == 'none' and full) then dead[#dead + 1] = ref end
end
if #dead > 0 then call_chunked('HDEL', K.backups, dead) end
-- the counts fair sharing and caps decide by, exact again whatever a script missed
recount(prefix, refs, gone, now)
-- tasks past their failure limit halt (their keys and lanes were read by `stall`)
for _, tid in ipairs(halts) do halt_task(prefix, tid, fast_reason(prefix, tid), now) end
-- the expired leases found here go (their refs are all back); a lease found expired by a ref's
-- holder lookup goes too
local lapsed = {}
for inst, l in pairs(leases) do
  if l == 'expired' then lapsed[#lapsed + 1] = inst end
end
if #lapsed > 0 then call_chunked('ZREM', K.leases, lapsed) end
return { 1, recovered, failed, #marked, next_expiry() }
