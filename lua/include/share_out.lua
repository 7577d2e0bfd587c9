--[[
  How a claim shares fresh shards among runnable tasks (docs/design/fairness.md): strictly by
  priority; within one, each share to the unit (a group, or a task of none) of the lowest level
  for its weight, within a group to its task of the lowest level for its weight, equal ones by
  dispatch order; never past a task's or group's cap. A level is the usage (the slot-time held
  lately, decayed) plus PROJECT_MS for each shard held now. The counts and usages are `held`
  (lua/include/fair.lua) plus what the claim took so far: its ledger.

  include: task, lanes, fair
]]
-- What a held shard adds to its holder's level (ms of slot-time it is expected to hold): the
-- counts held now weigh against the usage of the past.
local PROJECT_MS = 1000

-- Runnable tasks a claim considers, over all the lanes it reads (each lane at least
-- LANE_MIN), by priority then dispatch order; tasks at their caps are passed over without
-- counting, reading at most PAGES windows of a lane.
local WINDOW = 64
local LANE_MIN = 8
local PAGES = 4

-- A task not measured yet is tried ahead only once it has been runnable this long (ms): until
-- then the executors idle beside the one claiming have had no time to take their part.
local TRY_AFTER_MS = 20

-- A claim's view of the counts: `held` as read, plus what this call took (written at `commit`).
local function new_ledger(now)
  local L = { plus = {}, gplus = {}, held = {}, gheld = {}, gcap = {}, used = {} }
  -- shards task `tid` holds
  function L.task(tid)
    local h = L.held[tid]
    if h == nil then
      h = tonumber(rcall('HGET', K.held, tid) or '0')
      L.held[tid] = h
    end
    return h + (L.plus[tid] or 0)
  end
  -- shards group `g` holds, and its cap (false: none)
  function L.group(g)
    local h = L.gheld[g]
    if h == nil then
      h = tonumber(rcall('HGET', K.held, 'g:' .. g) or '0')
      L.gheld[g] = h
      L.gcap[g] = tonumber(rcall('HGET', K.meta, 'group_max:' .. g) or '') or false
    end
    return h + (L.gplus[g] or 0), L.gcap[g]
  end
  -- whether task `tid` (its cap `max`, its group `g`) holds as many as its cap or its group's
  function L.at_cap(tid, max, g)
    if max and L.task(tid) >= tonumber(max) then return true end
    if g then
      local h, cap = L.group(g)
      if cap and h >= cap then return true end
    end
    return false
  end
  -- room left under task `c`'s caps (c.cap, c.group)
  function L.room(tid, cap, g)
    local room = math.huge
    if cap then room = cap - L.task(tid) end
    if g then
      local h, gcap = L.group(g)
      if gcap then room = math.min(room, gcap - h) end
    end
    return math.max(room, 0)
  end
  -- the usage of count field `field` (a task id, or `g:<group>`) now, its count as read
  function L.usage(field, read)
    local u = L.used[field]
    if u == nil then
      u = usage_at(rcall('HGET', K.held, 'u:' .. field), read, now)
      L.used[field] = u
    end
    return u
  end
  -- levels: usage plus what is held now, for a weight
  function L.task_level(tid, w)
    local h = L.task(tid)
    return (L.usage(tid, L.held[tid]) + h * PROJECT_MS) / w
  end
  function L.group_level(g, w)
    local h = L.group(g)
    return (L.usage('g:' .. g, L.gheld[g]) + h * PROJECT_MS) / w
  end
  function L.take(tid, g, k)
    -- read first: the commit brings the usage up to date with the count as read
    L.task(tid)
    if g then L.group(g) end
    L.plus[tid] = (L.plus[tid] or 0) + k
    if g then L.gplus[g] = (L.gplus[g] or 0) + k end
  end
  function L.commit()
    for tid, k in pairs(L.plus) do
      usage_fold(tid, L.held[tid], now)
      rcall('HINCRBY', K.held, tid, k)
    end
    for g, k in pairs(L.gplus) do
      usage_fold('g:' .. g, L.gheld[g], now)
      rcall('HINCRBY', K.held, 'g:' .. g, k)
    end
  end
  return L
end

-- Among `xs` (each with a `score`), the one `ok` whose `level` is lowest (ties: the lowest
-- score), the lowest level of the others (nil if none), and how many are `ok`.
local function lowest(xs, level, ok)
  local best, bl, nl, m = nil, nil, nil, 0
  for _, x in ipairs(xs) do
    if ok(x) then
      m = m + 1
      local l = level(x)
      if not best or l < bl or (l == bl and x.score < best.score) then
        if best and (not nl or bl < nl) then nl = bl end
        best, bl = x, l
      elseif not nl or l < nl then
        nl = l
      end
    end
  end
  return best, bl, nl, m
end

-- Hands out up to `want` fresh shards among `units` (only to fast tasks when `fast_only`) by
-- water-filling: the lowest unit gets enough to reach the next one's level (or on a tie an even
-- part of what is left, at least), so the loop ends within a few rounds of the candidates
-- whatever the count.
local function fill(L, units, want, fast_only)
  local function room(c)
    if c.left <= 0 then return 0 end
    local r = math.min(c.left, L.room(c.tid, c.cap, c.group))
    if fast_only then r = math.min(r, c.ahead) end
    return r
  end
  local function unit_ok(u)
    for _, c in ipairs(u.tasks) do
      if room(c) > 0 then return true end
    end
    return false
  end
  local function task_ok(c) return room(c) > 0 end
  local function unit_level(u)
    if u.group then return L.group_level(u.group, u.w) end
    return L.task_level(u.tasks[1].tid, u.w)
  end
  while want > 0 do
    local u, ul, unl, um = lowest(units, unit_level, unit_ok)
    if not u then break end
    local c, cl, cnl, cm = lowest(u.tasks, function(x) return L.task_level(x.tid, x.w) end, task_ok)
    -- enough to lift the unit (and the task within it) to the next level, each shard lifting
    -- it by PROJECT_MS for its weight
    local q = math.huge
    if unl then q = math.min(q, math.ceil((unl - ul) * u.w / PROJECT_MS)) end
    if cnl then q = math.min(q, math.ceil((cnl - cl) * c.w / PROJECT_MS)) end
    -- at least an even part of what is left (of the group's room, under a group cap): levels
    -- closer than that are as good as tied, and the loop then ends within a few rounds of the
    -- candidates whatever the count
    local spread = want
    if u.group then
      local h, cap = L.group(u.group)
      if cap then spread = math.min(spread, cap - h) end
    end
    q = math.max(q, math.ceil(spread / (um * cm)))
    q = math.min(q, want, room(c))
    c.take, c.left = c.take + q, c.left - q
    if fast_only then c.ahead = c.ahead - q end
    L.take(c.tid, c.group, q)
    want = want - q
  end
end

-- The units of candidates `from`..`to` (one priority): a group (its weight from `meta`) or a
-- task of none.
local function units_of(cands, from, to)
  local units, by = {}, {}
  for i = from, to do
    local c = cands[i]
    local u = c.group and by[c.group]
    if not u then
      if c.group then
        local gw = tonumber(rcall('HGET', K.meta, 'group_weight:' .. c.group) or '1') or 1
        u = { group = c.group, w = math.max(gw, 0.001), score = c.score, tasks = {} }
        by[c.group] = u
      else
        u = { w = c.w, score = c.score, tasks = {} }
      end
      units[#units + 1] = u
    end
    u.tasks[#u.tasks + 1] = c
  end
  return units
end

-- Shares out `now_want` shards for free run slots among the runnable tasks of `lanes`, and
-- `ahead_want` more to wait for a slot: without bound to the tasks `speeds` names (comma-joined
-- ids: measured short), none to those it names with a `-` (measured long, or enough of them
-- held here untried), at most `probe` to any other once it has been runnable for TRY_AFTER_MS
-- by `now` (`*` or nil: any without bound). Both from
-- the best priority with work (shards ahead never from a lower priority than the next shards of
-- a higher one). Entries to drop from a lane's `tasks` (gone, spent, of another kind) are added
-- to `exhausted` as { lane index, task id }. Returns the candidates, each with `take` (shards
-- handed out from its `cursor`), `left`, `li`, `tid`, `tkey`, `seq` and `inc`.
local function share_out(prefix, lanes, L, now_want, ahead_want, speeds, probe, now, exhausted)
  local all, named = speeds == nil or speeds == '*', {}
  if not all then
    for e in string.gmatch(speeds, '[^,]+') do
      if string.sub(e, 1, 1) == '-' then named[string.sub(e, 2)] = 0 else named[e] = math.huge end
    end
  end
  local cands = {}
  local per_lane = math.max(LANE_MIN, math.floor(WINDOW / math.max(#lanes, 1)))
  for li = 1, #lanes do
    local got, from = 0, 0
    for _ = 1, PAGES do
      local r = rcall('ZRANGE', lane_key(prefix, lanes[li], 'tasks'), from, from + per_lane - 1, 'WITHSCORES')
      for i = 1, #r, 2 do
        local tid = r[i]
        local tkey = task_key(prefix, tid, '')
        local t = rcall('HMGET', tkey, 'cursor', 'total', 'seq', 'inc', 'kind', 'weight', 'group', 'max_running', 'created_ms', 'start_ms', 'retried_ms')
        if not t[1] or (t[5] and t[5] ~= lanes[li]) or tonumber(t[1]) >= tonumber(t[2]) then
          exhausted[#exhausted + 1] = { li, tid }
        elseif L.room(tid, tonumber(t[8] or ''), t[7] or false) > 0 then
          local score = tonumber(r[i + 1])
          local since = math.max(tonumber(t[9] or '0') or 0, tonumber(t[10] or '0') or 0, tonumber(t[11] or '0') or 0)
          local try = (now - since >= TRY_AFTER_MS) and probe or 0
          cands[#cands + 1] = {
            li = li, tid = tid, tkey = tkey, score = score, band = math.floor(score / 4294967296),
            cursor = tonumber(t[1]), left = tonumber(t[2]) - tonumber(t[1]), seq = t[3], inc = t[4] or '',
            w = math.max(tonumber(t[6] or '1') or 1, 0.001), group = t[7] or false,
            cap = tonumber(t[8] or ''), take = 0,
            ahead = (all and math.huge) or named[tid] or try,
          }
          got = got + 1
        end
        -- (a task at its cap is passed over: it takes no place among the candidates)
      end
      from = from + per_lane
      if got >= per_lane or #r < 2 * per_lane then break end
    end
  end
  table.sort(cands, function(x, y) return x.score < y.score end)
  local i, ahead_done = 1, false
  while i <= #cands and (now_want > 0 or (ahead_want > 0 and not ahead_done)) do
    local j = i
    while j < #cands and cands[j + 1].band == cands[i].band do j = j + 1 end
    local units = units_of(cands, i, j)
    local function taken_here()
      local got = 0
      for k = i, j do got = got + cands[k].take end
      return got
    end
    if now_want > 0 then
      local before = taken_here()
      fill(L, units, now_want, false)
      now_want = now_want - (taken_here() - before)
    end
    local work = taken_here() > 0
    for k = i, j do
      local c = cands[k]
      if c.left > 0 and L.room(c.tid, c.cap, c.group) > 0 then work = true end
    end
    if work and not ahead_done then
      ahead_done = true
      if ahead_want > 0 then fill(L, units, ahead_want, true) end
    end
    i = j + 1
  end
  return cands
end
