--[[
  Claims up to `count` shards for one executor, all under one token `<instance>:<seq>` (one token
  per claim call: a shard is never claimed twice by one call), of the kinds the executor serves
  only (docs/design/lanes.md). Order: explicit refs in the served lanes' waits
  (released and aggregation jobs at the front, recovered and due retries at the back; the lane
  to start at turns with the claim's seq), then refs routed to this node (one of a kind not
  served goes to its lane's wait), then fresh indexes from the cursors of the served lanes'
  runnable tasks: strictly by priority, and within a priority shared fairly by the shards each
  task and group holds, in proportion to weights, under the tasks' and groups' caps
  (docs/design/fairness.md; a ref of a task or group at its cap goes to the back of its list,
  untaken). Refs are
  `<task>:<seq>:<index>`: a ref of another incarnation (its task's `seq` differs), of a task
  gone, ended or not started, of a terminal shard, or one already held (in `active`, or taken
  earlier in this call) is dropped. The claim also renews the executor's lease.

  The queue-wide rate limit (`meta` limit_max, limit_per_ms; set by `shardctl limit`) is a
  sliding log in `limiter`: one entry `<token>|<k>` per claim call that started k shards, scored
  by Redis's own clock (TIME, in µs, as every time here), so that executors share one window;
  `meta` limit_used is the sum of k over the log. In no window of limit_per_ms do more than
  limit_max shards start; when the window is full the claim returns the exact time it frees.
  Under a limit the claim takes at most start_now shards: a shard claimed ahead would start
  later than the log says, and a window could then hold more starts than the limit.

  KEYS[1]  kinds         set    kinds that may have a lane
  KEYS[2]  delayed       zset   ref -> due time (ms)
  KEYS[3]  active        hash   ref -> token of its holder
  KEYS[4]  meta          hash   `paused`
  KEYS[5]  node:<n>:wait list   refs routed to this executor's node
  KEYS[6]  rebalancing   string while set, node lists are being re-placed: leave them alone
  KEYS[7]  leases        zset   instance -> lease expiry (ms): this executor's is renewed
  KEYS[8]  limiter       zset   claim calls in the rate limit's window, by start time (µs)
  KEYS[9]  events        stream the event log
  KEYS[10] marker        zset   wakes blocked executors
  KEYS[11] routed-nodes  set    nodes that may have a routed list
  KEYS[12] scheduled     zset   delayed tasks, by start time
  KEYS[13] unrouted      zset   routed tasks not fully placed
  KEYS[14] held          hash   held index shards per task and group (lua/include/fair.lua)
  KEYS[15] speculating   zset   ref -> claim ms: held first attempts of tasks with --speculate
  KEYS[16] backups       hash   ref -> token of the shard's backup attempt
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] count       shards wanted (> 0)
  ARGV[3] lock_ms     lease duration
  ARGV[4] token       `<instance>:<seq>`
  ARGV[5] start_now   how many of `count` the executor can start at once (the others it claims
                      ahead, to start when a running shard ends)
  ARGV[6] kinds       the kinds served, joined by commas, or `*`: every kind in `kinds` (a kind
                      whose lane keys are gone leaves `kinds`; a push adds it again)
  ARGV[7] speeds      which tasks' fresh shards may be claimed ahead, joined by commas: an id
                      (measured short: any number), `-id` (measured long, or enough held
                      untried: none); `*` (also when absent): any task, any number
  ARGV[8] probe       how many a task ARGV[7] does not name may get ahead (tried out), once it
                      has been runnable for 20 ms

  Returns { next, flags, ref_1, attempt_1, fails_1, inc_1, ... } (a backup attempt's fails as
  -1 - fails); a run of k fresh shards of
  one task (consecutive indexes from its cursor, attempt 1, no fails) is one quadruple
  { first ref, -k, 0, inc } (the reply and its parsing cost nothing per shard). `inc` is the
  task record's incarnation id (`<seq>.<nonce>`; '' for a record written before it had one):
  the executor's task cache compares it whole (docs/design/identity.md). `next` is 0 when shards were claimed, -2
  when the queue is paused, -3 when the queue has a rate limit and start_now is 0 (the limit
  counts starts: nothing is claimed ahead under it), else how many ms from now the earliest
  delayed ref or task is due, or the rate limit frees a slot (at least 1), or -1 if none; -3 also
  when start_now is 0 and nothing could be claimed ahead (ask again when a run slot frees).
  `flags`: 1 when this claim had to take the executor's lease again (it had expired: the
  executor must check which of its shards are still its own, see extend.lua), plus 2 when the
  queue has a rate limit (the executor gives back what it holds ahead).

  With free run slots left and nothing else to run, the claim starts backup attempts of
  straggling shards of tasks with `--speculate` held by other executors (no queue rate limit;
  docs/design/speculation.md, lua/include/speculate.lua): each is returned as an explicit ref,
  held in `backups` under this token, not in `active`. With nothing claimed, `next` is at most
  the time until a listed shard straggles.

  include: chunked, due, hold, lanes, share_out, speculate, task
]]
local prefix, count, lock_ms, token = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local start_now = tonumber(ARGV[5])
local clock = rcall('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local m = rcall('HMGET', K.meta, 'paused', 'limit_max', 'limit_per_ms', 'limit_used')
-- bit 2 of the reply's flags: the queue has a rate limit (the executor then holds nothing ahead)
local limited = tonumber(m[2] or '0') > 0 and 2 or 0
if m[1] == '1' then return { -2, limited } end

-- due retries become explicit refs (routed ones go back to their node's list), due tasks start
promote_due(prefix, now)

-- the served lanes, in a fixed order (read after the promotion: it may add a kind)
local every = ARGV[6] == '*'
local lanes, served = {}, {}
if every then
  lanes = rcall('SMEMBERS', K.kinds)
  table.sort(lanes)
else
  for k in string.gmatch(ARGV[6] or '', '[^,]+') do
    -- each lane once: a lane read twice would hand out its cursor's indexes twice
    if not served[k] then
      lanes[#lanes + 1] = k
      served[k] = true
    end
  end
end
for _, k in ipairs(lanes) do served[k] = true end
-- read first: every served lane's keys, markers included, before the first write below
-- (docs/design/declared-keys.md, order of writes; lane keys are derived)
for _, k in ipairs(lanes) do touch_lane(prefix, k) end

local limit_max, rnow = tonumber(m[2] or '0'), 0
if limit_max > 0 then
  if start_now <= 0 then return { -3, limited } end
  count = math.min(count, start_now)
  -- in microseconds: a start exactly one window after another is allowed, none sooner
  local per = tonumber(m[3]) * 1000
  rnow = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local used = tonumber(m[4] or '0')
  local old = rcall('ZRANGEBYSCORE', K.limiter, '-inf', rnow - per)
  if #old > 0 then
    local gone = 0
    for _, e in ipairs(old) do gone = gone + tonumber(string.match(e, '|(%d+)$') or '0') end
    rcall('ZREMRANGEBYSCORE', K.limiter, '-inf', rnow - per)
    used = rcall('HINCRBY', K.meta, 'limit_used', -gone)
  end
  if used ~= 0 and rcall('EXISTS', K.limiter) == 0 then
    -- the log is empty (removed by hand, or by `limit --off` racing this claim): so is the window
    used = 0
    rcall('HDEL', K.meta, 'limit_used')
  end
  local free = limit_max - used
  if free <= 0 then
    local oldest = rcall('ZRANGE', K.limiter, 0, 0, 'WITHSCORES')
    -- when the oldest start leaves the window, in ms from now (rounded up)
    return { math.max(1, math.ceil((tonumber(oldest[2]) + per - rnow) / 1000)), limited }
  end
  count = math.min(count, free)
end

local out = { 0, limited }
local held = {}
-- entries in `out` and `held` (counted: `#t` is a search in Lua 5.1), shards taken
local on, hn, n = 2, 0, 0
-- refs of removed tasks or already terminal shards are dropped, at most this many per call,
-- so that one call never keeps Redis busy for long
local junk_left = 1000

-- Plan, then commit (docs/design/declared-keys.md, order of writes): the refs to take are
-- decided by reads alone, the writes they need are listed, and only then made. A read of a key
-- of a slot being migrated aborts the script before anything was popped or handed out.
local attempts = {} -- { key, field, value }: attempt numbers of explicit refs with state
local drops = {}    -- { tid, idx }: terminal refs whose state goes with them
local cursors = {}  -- { task key, k }: fresh indexes taken from a task's cursor
local exhausted = {} -- { lane, task id }: tasks to leave their lane's `tasks`
local foreign = {}  -- kind -> routed refs this node does not serve, for the kind's lane wait

local function take_ref(ref, attempt, fails, inc)
  held[hn + 1], held[hn + 2] = ref, token
  hn = hn + 2
  out[on + 1], out[on + 2], out[on + 3], out[on + 4] = ref, attempt, fails, inc
  on = on + 4
  n = n + 1
end

-- refs taken by this call: one call never hands out a ref twice
local taken = {}
-- whether any shard has a backup attempt: read once, by the first explicit ref that needs it
local spec_any = nil
-- first attempts of tasks with --speculate taken by this call, for `speculating`
local spec_new = {}

-- what `held` says plus what this call took (lua/include/share_out.lua); refs of a capped task
-- or group go to the back of their list (at most this many per call: a bounded scan)
local ledger = new_ledger(now)
local back = {} -- list key -> refs capped, to push back
local capped_left = 0 -- per list (plan_list)
local capped = {} -- task ids found at their cap by this call

-- an explicit or routed ref, if the current incarnation of its task still wants it and nobody
-- holds it; a ref has state only once it was claimed and given back, recovered, retried or
-- released before. A ref of another incarnation has no state to remove: state lives in the
-- current incarnation's `:shards`.
local function try_ref(ref, routed, list)
  local tid, inc, idx = split_ref(ref)
  if tid and capped[tid] and idx ~= 'agg' and not taken[ref] then
    -- its task was found at its cap: to the back, not read again
    local b = back[list] or {}
    back[list] = b
    b[#b + 1] = ref
    taken[ref] = true
    capped_left = capped_left - 1
    return
  end
  local tkey = tid and task_key(prefix, tid, '')
  local t = tid and not taken[ref] and rcall('HMGET', tkey, 'state', 'total', 'seq', 'inc', 'kind', 'max_running', 'group', 'speculate')
  local state = t and t[3] == inc and t[1]
  -- a task that ended (cancelled, halted: docs/design/failure-policies.md) or has not started
  -- wants none of its refs
  local ok = state == 'running' or state == 'aggregating'
  if ok and routed and not every and not served[t[5]] then
    -- placed on this node before its executor served other kinds: any executor serving the
    -- kind takes it from the lane (its placement is lost, never the shard)
    touch_lane(prefix, t[5])
    local l = foreign[t[5]]
    if not l then
      l = {}
      foreign[t[5]] = l
    end
    l[#l + 1] = ref
    taken[ref] = true
    junk_left = junk_left - 1
    return
  end
  if ok and idx == 'agg' then
    ok = state == 'aggregating'
  elseif ok then
    -- an index ref only of a running task: a settled one aggregates with shards cancelled
    local i = tonumber(idx)
    ok = state == 'running' and i ~= nil and i < tonumber(t[2])
    if ok and rcall('GETBIT', task_key(prefix, tid, ':terminal'), idx) == 1 then
      -- terminal (requeued after it finished): its state, if any, goes with the ref
      rcall('EXISTS', shards_key(prefix, tid))
      drops[#drops + 1] = { tid, idx }
      ok = false
    end
  end
  -- a held ref stays its holder's, with its state (a backup attempt's too)
  if ok then ok = rcall('HEXISTS', K.active, ref) == 0 end
  if ok then
    if spec_any == nil then spec_any = rcall('EXISTS', K.backups) == 1 end
    ok = not (spec_any and backup_of(ref))
  end
  if not ok then
    junk_left = junk_left - 1
    return
  end
  if idx ~= 'agg' and ledger.at_cap(tid, t[6], t[7]) then
    capped[tid] = true
    -- its task or group runs as many as it may: to the back of the list, for a later claim
    local b = back[list]
    if not b then
      b = {}
      back[list] = b
    end
    b[#b + 1] = ref
    taken[ref] = true
    capped_left = capped_left - 1
    return
  end
  if idx ~= 'agg' then ledger.take(tid, t[7], 1) end
  if idx ~= 'agg' and t[8] then spec_new[#spec_new + 1] = ref end
  taken[ref] = true
  local skey = shards_key(prefix, tid)
  local s = rcall('HMGET', skey, idx .. ':attempt', idx .. ':fails')
  if not s[1] and not s[2] then
    -- no state: a first claim (a lazy ref, an aggregation job, a shard given back unstarted),
    -- implied; whatever gives it back later records the attempt (requeue)
    take_ref(ref, 1, 0, t[4] or '')
  else
    local attempt = tonumber(s[1] or '0') + 1
    attempts[#attempts + 1] = { skey, idx .. ':attempt', attempt }
    take_ref(ref, attempt, tonumber(s[2] or '0'), t[4] or '')
  end
end

-- how many refs at the head of list `key` this call takes or drops
local function plan_list(key, routed)
  local consumed = 0
  capped_left = 100
  while n < count and junk_left > 0 and capped_left > 0 do
    local peek = rcall('LRANGE', key, consumed, consumed + (count - n) - 1)
    if #peek == 0 then break end
    for _, ref in ipairs(peek) do
      consumed = consumed + 1
      try_ref(ref, routed, key)
      if n >= count or junk_left <= 0 or capped_left <= 0 then break end
    end
  end
  return consumed
end

-- the lane waits, from the lane this claim's seq picks (no served kind's retries starve
-- another's), then the node's routed list
local from_wait = {} -- lane index -> refs consumed
local turn = tonumber(string.match(token, ':(%d+)$') or '0')
for i = 0, #lanes - 1 do
  if n >= count or junk_left <= 0 then break end
  local li = (turn + i) % #lanes + 1
  from_wait[li] = plan_list(lane_key(prefix, lanes[li], 'wait'), false)
end
local from_node = 0
if n < count and junk_left > 0 and rcall('EXISTS', K.rebalancing) == 0 then
  from_node = plan_list(K.node_wait, true)
end

-- fresh cursors, shared fairly among the served lanes' runnable tasks (lua/include/share_out.lua):
-- those wanted for free run slots among all, those wanted ahead by ARGV[7] and ARGV[8]
local cands = {}
if n < count then
  local now_want = math.min(count - n, math.max(start_now - n, 0))
  cands = share_out(prefix, lanes, ledger, now_want, count - n - now_want, ARGV[7], tonumber(ARGV[8] or '0'), now, exhausted)
end
for _, c in ipairs(cands) do
  if c.take > 0 then
    cursors[#cursors + 1] = { c.tkey, c.take }
    local pre = c.tid .. ':' .. c.seq .. ':'
    out[on + 1], out[on + 2], out[on + 3], out[on + 4] = pre .. c.cursor, -c.take, 0, c.inc
    on = on + 4
    local spec = rcall('HEXISTS', c.tkey, 'speculate') == 1
    for x = c.cursor, c.cursor + c.take - 1 do
      held[hn + 1], held[hn + 2] = pre .. x, token
      hn = hn + 2
      if spec then spec_new[#spec_new + 1] = pre .. x end
    end
    n = n + c.take
  end
  if c.left <= 0 then exhausted[#exhausted + 1] = { c.li, c.tid } end
end

-- backups of stragglers for the run slots still free (none under a rate limit: each start counts)
local inst = string.match(token, '^(.*):[^:]*$')
local picks, stale, soonest = {}, {}, nil
if limit_max == 0 and n < start_now then
  picks, stale, soonest = plan_backups(prefix, start_now - n, inst, now, taken, not every and served or nil)
  for _, p in ipairs(picks) do
    -- (a backup's fails as -1 - fails: the executor tells it from a first attempt)
    out[on + 1], out[on + 2], out[on + 3], out[on + 4] = p[1], p[7], -1 - p[8], p[4]
    on = on + 4
  end
end

-- commit
for li, c in pairs(from_wait) do
  if c > 0 then rcall('LTRIM', lane_key(prefix, lanes[li], 'wait'), c, -1) end
end
if from_node > 0 then rcall('LTRIM', K.node_wait, from_node, -1) end
for kind, refs in pairs(foreign) do lane_push(prefix, kind, refs, false) end
for _, a in ipairs(attempts) do rcall('HSET', a[1], a[2], a[3]) end
for _, d in ipairs(drops) do drop_state(prefix, d[1], d[2]) end
for _, c in ipairs(cursors) do rcall('HINCRBY', c[1], 'cursor', c[2]) end
for _, e in ipairs(exhausted) do rcall('ZREM', lane_key(prefix, lanes[e[1]], 'tasks'), e[2]) end
for key, refs in pairs(back) do call_chunked('RPUSH', key, refs) end
ledger.commit()
spec_forget(stale)
for _, ref in ipairs(spec_new) do spec_held(ref, now) end
start_backups(prefix, picks, token)

-- work left in a served lane (or junk left behind): the next blocked executor serving it wakes;
-- under `*`, a kind whose lane is gone leaves `kinds`
local function pass_on()
  for li, kind in ipairs(lanes) do
    local left = rcall('EXISTS', lane_key(prefix, kind, 'wait'), lane_key(prefix, kind, 'tasks'))
    if left > 0 then
      wake_lane(prefix, kind)
    elseif every then
      rcall('SREM', K.kinds, kind)
    end
  end
end
if junk_left <= 0 then pass_on() end
if n > 0 or #picks > 0 then
  if n > 0 then
    held[hn + 1], held[hn + 2] = ACTIVE_PIN, ACTIVE_PIN_VALUE
    call_chunked('HSET', K.active, held)
  end
  -- the token is `<instance>:<seq>`: the lease is the instance's
  local lease = rcall('ZSCORE', K.leases, inst)
  if not lease or tonumber(lease) <= now then out[2] = out[2] + 1 end
  rcall('ZADD', K.leases, now + lock_ms, inst)
  if limit_max > 0 then
    rcall('ZADD', K.limiter, rnow, token .. '|' .. n)
    rcall('HINCRBY', K.meta, 'limit_used', n)
  end
  if junk_left > 0 then pass_on() end
  return out
end
-- nothing for a claim only ahead of busy slots (no task measured short): claim again when a
-- slot frees, not when new work arrives (which could not start here sooner either)
if start_now <= 0 then return { -3, limited } end
local due = next_due()
-- (a listed shard that will straggle: the executor claims again then)
if soonest and (not due or soonest < due) then due = soonest end
return { due and math.max(1, due - now) or -1, limited }
