--[[
  Completes claimed shards (and aggregation jobs), each only if its token still holds it; a batch
  costs a handful of commands per task, not per shard. A shard is counted once: the terminal
  bitmap decides (BITFIELD returns each old bit). The last terminal shard of a task enqueues
  `<task>:<seq>:agg`; completing that records the result. A task whose `done` reaches its
  `success_when` settles once the call's other writes are done (lua/include/settle.lua): its
  other shards are cancelled and it aggregates (docs/design/failure-policies.md).

  A shard of another incarnation (its task's `seq` is not the one given), past the task's total,
  or of a task gone is refused (-3) and let go. Writes come in an order that an abort part-way
  (a derived key of a slot being migrated) leaves repairable: terminal bits and counters first,
  then the shards leave `active` (a shard left terminal and held is let go by its holder's retry,
  which finds it terminal, or by the sweep, whose requeued ref the claim drops).

  KEYS[1]  active     hash   ref -> token
  KEYS[2]  stalled    set
  KEYS[3]  events     stream the event log
  KEYS[4]  expiring   zset   ended tasks with a retention, by expiry time
  KEYS[5]  finished   zset   ended tasks, by end time
  KEYS[6]  meta       hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[7]  running    zset   tasks not finished
  KEYS[8]  kinds      set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[9]  unreported zset   (a partition's) shares ended, not yet counted in the home
  KEYS[10] held       hash   held index shards per task and group (lua/include/fair.lua)
  KEYS[11] delayed    zset   ref -> due time (a settled task's refs leave it)
  KEYS[12] unrouted   zset   routed tasks not fully placed (a settled one leaves it)
  KEYS[13] routed-nodes set  nodes that may have a routed list (a settled task's refs leave them)
  KEYS[14] reroute    list   recovered and released refs of routed tasks (likewise)
  KEYS[15] speculating zset  ref -> claim ms of first attempts of tasks with --speculate
  KEYS[16] backups    hash   ref -> token of the shard's backup attempt
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2..] groups: task id, seq (its incarnation), token, m, `p` or `f`, run times, longest,
            at, then m entries: for `p` (plain: no state, no result) an index each; for `f` an
            index (or `agg`), has_state (1 when the shard may have state in
            `task:<id>:shards`) and result (JSON text; empty for none) each. Run times: one byte
            per entry, 1 + its run time's bucket (0: not measured; lua/include/durations.lua),
            measured by its executor's clock; longest: the longest of them in ms, of entry `at`
            (1-based; 0: none). The shards counted add their buckets to their task's histogram,
            the longest if its entry is counted, and their count to the task's completions over
            time (lua/include/throughput.lua).

  Returns one code per shard, in the order given: 1 counted, 0 already terminal (finished
  twice), -1 lock missing, -2 lock mismatch, -3 task missing (or another incarnation).

  A shard with a backup attempt (docs/design/speculation.md) is completed by either token, once:
  the first to finish wins, the other attempt's hold goes with it (`cancels` tells its executor),
  and a task with `--speculate` measures the shard's time.

  include: chunked, clock, durations, events, fair, finish, halt, lanes, settle, speculate, task, throughput
]]
local prefix, now = ARGV[1], now_ms()

-- parse: one entry per shard (counted: `#t` is a search in Lua 5.1)
local idxs, tokens, states, results, refs, runs = {}, {}, {}, {}, {}, {}
local groups = {}
local a, n, nargs = 2, 0, #ARGV
while a <= nargs do
  local tid, inc, token, m, plain = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4] == 'p'
  local first, pre = n + 1, tid .. ':' .. inc .. ':'
  local bytes, longest, at = ARGV[a + 5], ARGV[a + 6], tonumber(ARGV[a + 7]) or 0
  a = a + 8
  for _ = 1, m do
    n = n + 1
    local idx = ARGV[a]
    idxs[n], tokens[n], refs[n] = idx, token, pre .. idx
    runs[n] = string.byte(bytes, n - first + 1) or 0
    if plain then
      states[n], results[n] = '0', ''
      a = a + 1
    else
      states[n], results[n] = ARGV[a + 1], ARGV[a + 2]
      a = a + 3
    end
  end
  groups[#groups + 1] = { tid, first, n, inc, longest, at > 0 and first + at - 1 or nil }
end
local cur = {}
for s = 1, n, 4000 do
  local part = rcall('HMGET', K.active, unpack(refs, s, math.min(s + 3999, n)))
  for j = 1, #part do cur[s + j - 1] = part[j] end
end

local codes, taken, nt = {}, {}, 0
-- a shard completed by its backup attempt's token (read only when a token is not `active`'s)
local by_backup, backups = {}, nil
for i = 1, n do
  if cur[i] ~= tokens[i] and backups == nil then backups = rcall('EXISTS', K.backups) == 1 end
  if cur[i] == tokens[i] then
    codes[i] = true
  elseif backups and backup_of(refs[i]) == tokens[i] then
    codes[i] = true
    by_backup[i] = true
  elseif not cur[i] then
    codes[i] = -1
  else
    codes[i] = -2
  end
  if codes[i] == true then
    nt = nt + 1
    taken[nt] = refs[i]
  end
end
if nt == 0 then return codes end

local per_shard_events = rcall('HGET', K.meta, 'events_completions') == '1'
-- read first: every key of a task this call may write, before the first write (an abort at a
-- key of a slot being migrated then leaves the shards held and nothing counted)
local tasks = {}
local lanes_read = {}
for gi, g in ipairs(groups) do
  local tid, first, last, inc = g[1], g[2], g[3], g[4]
  local any, agg, kept, state = false, false, false, false
  for i = first, last do
    if codes[i] == true then
      any = true
      if idxs[i] == 'agg' then agg = true end
      if results[i] ~= '' then kept = true end
      if states[i] == '1' then state = true end
    end
  end
  if any then
    -- (with what the run times and completions over time need: no read of their own)
    local t = rcall('HMGET', task_key(prefix, tid, ''), 'seq', 'total', 'done', 'failed', 'kind', 'success_when', 'speculate', 'h_max', 'tp_t0', 'tp_w')
    tasks[gi] = t
    if t[1] == inc then
      local sfx = { ':terminal' }
      if kept then sfx[#sfx + 1] = ':results' end
      if state then sfx[#sfx + 1] = ':errors'; sfx[#sfx + 1] = ':shards' end
      -- the aggregation job ends the task: its retention touches every key of it; a task that
      -- may settle (k-of-n) too, and the lists a settle writes
      if agg then sfx = nil end
      if t[6] and not agg then
        sfx = nil
        touch_halt(prefix, tid)
      end
      touch_task(prefix, tid, sfx)
      -- the last shard enqueues the aggregation job in the task's lane (whichever group of
      -- the call it is in): every task's lane is read, once per call
      if sfx and not lanes_read[t[5]] then
        touch_lane(prefix, t[5])
        lanes_read[t[5]] = true
      end
    end
  end
end

local unheld = {} -- { tid, inc, n }: index shards leaving `active`, for the counts
local timing = {} -- tid -> { h_max, tp_t0, tp_w } as this call left them
local stopped_other = false -- a shard ended with its other attempt still running
local settles = {} -- tasks that met their `success_when`, settled last
for gi, g in ipairs(groups) do
  local tid, first, last, inc = g[1], g[2], g[3], g[4]
  local tkey = task_key(prefix, tid, '')
  local t = tasks[gi] or {}
  local live = t[1] == inc
  local total = tonumber(t[2] or '0')
  local ops, mine, dropped = {}, {}, {}
  for i = first, last do
    if codes[i] == true then
      if not live then
        codes[i] = -3
      elseif idxs[i] == 'agg' then
        if states[i] == '1' then dropped[#dropped + 1] = 'agg' end
        codes[i] = finish_task(prefix, tid, true, results[i], now)
      else
        local idx = tonumber(idxs[i])
        if idx == nil or idx >= total then
          codes[i] = -3
        else
          local k = #mine + 1
          mine[k] = i
          -- the index as text: a Lua number would be formatted per shard
          ops[4 * k - 3], ops[4 * k - 2], ops[4 * k - 1], ops[4 * k] = 'SET', 'u1', idxs[i], '1'
        end
      end
    end
  end
  if #mine > 0 then
    unheld[#unheld + 1] = { tid, inc, #mine }
    local counted, stored, cleared, timed = 0, {}, {}, {}
    for s = 1, #mine, 1000 do
      local e = math.min(s + 999, #mine)
      local old = rcall('BITFIELD', task_key(prefix, tid, ':terminal'), unpack(ops, 4 * s - 3, 4 * e))
      for j = s, e do
        local i = mine[j]
        if old[j - s + 1] == 0 then
          codes[i] = 1
          counted = counted + 1
          if runs[i] > 0 then timed[#timed + 1] = runs[i] - 1 end
          if results[i] ~= '' then
            stored[#stored + 1] = idxs[i]
            stored[#stored + 1] = results[i]
          end
          -- only a shard that failed before can have left a reason
          if states[i] == '1' then cleared[#cleared + 1] = idxs[i] end
          if per_shard_events then emit('event', 'shard_completed', 'task', tid, 'shard', idxs[i]) end
        else
          codes[i] = 0
        end
        if states[i] == '1' then dropped[#dropped + 1] = idxs[i] end
      end
    end
    if counted > 0 then
      local done = rcall('HINCRBY', tkey, 'done', counted)
      if t[6] and done >= tonumber(t[6]) then settles[#settles + 1] = tid end
      if #stored > 0 then call_chunked('HSET', task_key(prefix, tid, ':results'), stored) end
      if #cleared > 0 then
        call_chunked('HDEL', task_key(prefix, tid, ':errors'), cleared)
        -- and the record of its failure (lua/fail.lua)
        local records = {}
        for k, idx in ipairs(cleared) do records[k] = idx .. ':failure' end
        call_chunked('HDEL', shards_key(prefix, tid), records)
      end
      -- (as read before the first write, or as an earlier group of the call left them)
      local tm = timing[tid] or { t[8], t[9], t[10] }
      tm[1] = add_durations(tkey, timed, g[6] and codes[g[6]] == 1 and g[5] or nil, tm[1])
      tm[2], tm[3] = add_throughput(tkey, counted, now, tm[2], tm[3])
      timing[tid] = tm
      maybe_aggregate(prefix, tid, now)
    end
  end
  for _, idx in ipairs(dropped) do drop_state(prefix, tid, idx) end
  -- speculation: the time measured, the other attempt stopped
  if t[7] then
    for _, i in ipairs(mine) do
      spec_ended(prefix, tid, refs[i], now)
      if drop_backup(refs[i]) or by_backup[i] then
        stopped_other = true
        if by_backup[i] and codes[i] == 1 then rcall('HINCRBY', tkey, 'spec_won', 1) end
        emit('event', 'speculation_won', 'task', tid, 'shard', idxs[i], 'attempt', by_backup[i] and 'backup' or 'first')
      end
    end
  end
end
-- the losing attempts' executors learn at their next heartbeat that the shard ended
if stopped_other then rcall('HINCRBY', K.meta, 'cancels', 1) end
-- tasks that met their goal settle (their held refs and counts go with it), before anything
-- below may read a key it did not read first (a wake of every lane by `unhold`)
local settled = {}
for _, tid in ipairs(settles) do
  if settle_task(prefix, tid, now) == 1 then settled[tid] = true end
end
-- last: the shards leave `active` (see the header on the order of writes)
call_chunked('HDEL', K.active, taken)
if rcall('SCARD', K.stalled) > 0 then call_chunked('SREM', K.stalled, taken) end
for _, u in ipairs(unheld) do
  if not settled[u[1]] then unhold(prefix, u[1], u[2], u[3], now) end
end
return codes
