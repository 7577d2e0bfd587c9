--[[
  Fair sharing and caps (docs/design/fairness.md). `held` counts the index shards held in
  `active` (aggregation jobs are not counted): field `<task id>` those of the task's current
  incarnation, field `g:<group>` those of the tasks of a group (task ids have no colon, so no
  task's field is a group's). The claim adds what it takes; every script that takes a held shard
  out of `active` subtracts it (`unhold`); the sweep rebuilds the whole hash from `active`
  (`recount`), so that a count is never wrong for longer than one sweep interval whatever went
  wrong. Beside each count, its usage: field `u:<task id>` (`u:g:<group>`) is `U|T`, the
  slot-time held (ms) up to time T, halved every USAGE_HALF_MS; the sweep drops a task's once
  the task is no longer running, a group's once it is below a slot-ms. A task's `weight`, `group` and
  `max_running` are fields of its record; a group's weight and cap are `meta` fields
  `group_weight:<g>` and `group_max:<g>`.

  include: task, lanes, chunked
]]
-- Usage is remembered with this half-life (ms): a task that held many slots lately yields to one
-- that held few, and the past fades.
local USAGE_HALF_MS = 10000

-- The usage `rec` (`U|T`, or nil: none yet) at time `now`, `held` shards having been held since
-- T: the decayed integral of the count over time.
local function usage_at(rec, held, now)
  if not rec then return 0 end
  local u, t = string.match(rec, '^([^|]+)|(.+)$')
  local dt = math.max(now - (tonumber(t) or now), 0)
  local f = 2 ^ (-dt / USAGE_HALF_MS)
  return (tonumber(u) or 0) * f + held * (1 - f) * USAGE_HALF_MS / 0.6931471805599453
end

-- Brings the usage of count field `field` up to `now`, `held` having been its count since the
-- last time (called before the count changes).
local function usage_fold(field, held, now)
  local u = 'u:' .. field
  rcall('HSET', K.held, u, usage_at(rcall('HGET', K.held, u), held, now) .. '|' .. now)
end

-- `held` values are at least 0 and fields at 0 go away.
local function held_add(field, n)
  local v = rcall('HINCRBY', K.held, field, n)
  if v <= 0 then rcall('HDEL', K.held, field) end
  return v
end

-- Takes `n` held index shards of task `tid`, incarnation `inc`, out of the counts (nothing for
-- another incarnation's), their usage brought up to `now` first; when that frees a slot under
-- the task's cap it wakes the task's lane, under its group's every lane (the claims that found
-- the cap full got nothing and blocked). It reads the lanes it wakes right before: a script
-- aborted there (a slot being migrated) has left the counts for the sweep to rebuild.
local function unhold(prefix, tid, inc, n, now)
  if n <= 0 then return end
  local t = rcall('HMGET', task_key(prefix, tid, ''), 'seq', 'group', 'max_running', 'kind')
  if t[1] ~= inc then return end
  local left = held_add(tid, -n)
  usage_fold(tid, left + n, now)
  local freed = t[3] and left < tonumber(t[3]) and left + n >= tonumber(t[3])
  local group_freed = false
  if t[2] then
    local g = held_add('g:' .. t[2], -n)
    usage_fold('g:' .. t[2], g + n, now)
    local gmax = tonumber(rcall('HGET', K.meta, 'group_max:' .. t[2]) or '')
    group_freed = gmax and g < gmax and g + n >= gmax
  end
  -- the claims that found a cap full got nothing and blocked: wake the task's lane, and for a
  -- group (whose tasks may be of any kind) every lane
  if group_freed then
    for _, kind in ipairs(rcall('SMEMBERS', K.kinds)) do
      touch_lane(prefix, kind)
      wake_lane(prefix, kind)
    end
  elseif freed and t[4] then
    touch_lane(prefix, t[4])
    wake_lane(prefix, t[4])
  end
end

-- Forgets task `tid`'s count and usage (it ended, or a new task took its id): its group's count
-- loses it, its usage brought up to `now` first.
local function unhold_all(prefix, tid, now)
  local n = tonumber(rcall('HGET', K.held, tid) or '0')
  rcall('HDEL', K.held, tid, 'u:' .. tid)
  if n <= 0 then return end
  local g = rcall('HGET', task_key(prefix, tid, ''), 'group')
  if g then
    local left = held_add('g:' .. g, -n)
    usage_fold('g:' .. g, left + n, now)
  end
end

-- Rebuilds the counts of `held` from `refs` (the fields of `active`; `skip[ref]` for those gone
-- since): the counts are then exact whatever an earlier script missed. A count that changes has
-- its usage brought up to `now` with the count it had.
local function recount(prefix, refs, skip, now)
  local per = {}
  for _, ref in ipairs(refs) do
    local tid, inc, idx = split_ref(ref)
    if tid and idx ~= 'agg' and not skip[ref] then
      local key = tid .. ':' .. inc
      per[key] = (per[key] or 0) + 1
    end
  end
  local want = {} -- field -> count
  for key, n in pairs(per) do
    local tid, inc = string.match(key, '^(.*):(%d+)$')
    local t = rcall('HMGET', task_key(prefix, tid, ''), 'seq', 'group')
    if t[1] == inc then
      want[tid] = n
      if t[2] then want['g:' .. t[2]] = (want['g:' .. t[2]] or 0) + n end
    end
  end
  -- a count no shard backs goes; a usage stays while its task runs (a group's while it is
  -- above a slot-ms), so that the hash does not grow with every task ever run
  local have = {}
  local flat = rcall('HGETALL', K.held)
  for i = 1, #flat, 2 do have[flat[i]] = flat[i + 1] end
  local stale, fields = {}, {}
  for f, v in pairs(have) do
    if string.sub(f, 1, 4) == 'u:g:' then
      if not want[string.sub(f, 3)] and usage_at(v, 0, now) < 1 then stale[#stale + 1] = f end
    elseif string.sub(f, 1, 2) == 'u:' then
      local state = rcall('HGET', task_key(prefix, string.sub(f, 3), ''), 'state')
      if state ~= 'running' and state ~= 'aggregating' and state ~= 'delayed' then stale[#stale + 1] = f end
    elseif not want[f] then
      usage_fold(f, tonumber(v) or 0, now)
      stale[#stale + 1] = f
    end
  end
  for f, n in pairs(want) do
    local old = tonumber(have[f] or '0') or 0
    if old ~= n then
      usage_fold(f, old, now)
      fields[#fields + 1] = f
      fields[#fields + 1] = n
    end
  end
  if #stale > 0 then call_chunked('HDEL', K.held, stale) end
  if #fields > 0 then call_chunked('HSET', K.held, fields) end
end
