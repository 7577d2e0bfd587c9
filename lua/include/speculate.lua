--[[
  Backup attempts for stragglers (docs/design/speculation.md): the held first attempts of tasks
  with `--speculate` (`speculating`), their measured times (the task's `d<b>` histogram), which
  straggle, and a shard's second attempt (`backups`).

  include: chunked, events, task
]]
-- A first attempt straggles past max(SPEC_FACTOR × the task's median shard time, SPEC_FLOOR_MS),
-- once SPEC_MEASURED shards of the task were measured.
local SPEC_FACTOR = 1.5
local SPEC_FLOOR_MS = 500
local SPEC_MEASURED = 5
-- the histogram's buckets: ⌊log₁.₂₅(ms + 1)⌋
local SPEC_STEP = 1.25
-- the first attempts held longest that one claim looks at
local SPEC_SCAN = 200

-- Lists held first attempt `ref` of a task with `--speculate`, claimed at `now`.
local function spec_held(ref, now)
  rcall('ZADD', K.speculating, now, ref)
end

-- Shard `ref` is no longer held as a first attempt (failed, released, stalled, stopped).
local function spec_forget(refs)
  if #refs > 0 then call_chunked('ZREM', K.speculating, refs) end
end

-- The ended shard `ref` (index `idx` of task `tid`): out of `speculating`, its time measured
-- when no backup of it started (it was still listed).
local function spec_ended(prefix, tid, ref, now)
  local since = rcall('ZSCORE', K.speculating, ref)
  if not since then return end
  rcall('ZREM', K.speculating, ref)
  local ms = math.max(now - tonumber(since), 0)
  local b = math.floor(math.log(ms + 1) / math.log(SPEC_STEP))
  rcall('HINCRBY', task_key(prefix, tid, ''), 'd' .. b, 1)
end

-- Task `tid`'s straggling threshold in ms and its median, or nil before SPEC_MEASURED shards
-- were measured. The median is the geometric middle of its bucket.
local function spec_threshold(prefix, tid)
  local h = rcall('HGETALL', task_key(prefix, tid, ''))
  local buckets, total = {}, 0
  for i = 1, #h, 2 do
    local b = string.match(h[i], '^d(%d+)$')
    if b then
      local c = tonumber(h[i + 1])
      buckets[#buckets + 1] = { tonumber(b), c }
      total = total + c
    end
  end
  if total < SPEC_MEASURED then return nil end
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  local acc, median = 0, 0
  for _, x in ipairs(buckets) do
    acc = acc + x[2]
    if acc * 2 >= total then
      median = SPEC_STEP ^ (x[1] + 0.5) - 1
      break
    end
  end
  return math.max(SPEC_FACTOR * median, SPEC_FLOOR_MS), median
end

-- The token of shard `ref`'s backup attempt, or nil.
local function backup_of(ref)
  return rcall('HGET', K.backups, ref)
end

-- Drops shard `ref`'s backup attempt, if any: its holder learns at its next heartbeat (the
-- shard ended, or its task stopped). True when there was one.
local function drop_backup(ref)
  return rcall('HDEL', K.backups, ref) == 1
end

-- Attempt `token` of shard `ref` goes while the other attempt runs on (a failure to retry, a
-- release): a backup's hold (`backup`) is dropped; a first attempt's is taken over by its backup
-- (`active[ref]` takes the backup's token). True when the other attempt runs on: the caller then
-- records and requeues nothing. False when `token` is the shard's only attempt (a backup whose
-- holder's lease ran out by `now` is dropped, not promoted).
local function leave_attempt(ref, backup, now)
  if backup then
    rcall('HDEL', K.backups, ref)
    return true
  end
  local b = backup_of(ref)
  if not b then return false end
  rcall('HDEL', K.backups, ref)
  -- a backup whose holder's lease ran out is no attempt (the sweep would stall the shard)
  local expiry = rcall('ZSCORE', K.leases, string.match(b, '^(.*):[^:]*$') or b)
  if not expiry or tonumber(expiry) <= now then return false end
  rcall('HSET', K.active, ref, b)
  return true
end

-- Plans backups for up to `want` straggling shards for the claim of `token` (instance `inst`) at
-- `now` (docs/design/speculation.md, "When a shard gets a backup"): among the 200 first
-- attempts held longest, those of a running pull task of a kind the claim serves (`served`:
-- kind -> true, nil for every kind) that has handed out every index, started
-- fewer backups than its cap and has no cap of held shards (its own or its group's), held by
-- another instance, with no backup, past their task's threshold; refs `taken` by this claim are
-- not stale. Reads only.
-- Returns the picks ({ ref, tid, idx, the task's inc, running ms, threshold ms, attempt, fails }:
-- the backup runs as the same attempt), the entries to drop (no
-- longer held, or their task ended), and the earliest time a listed shard crosses its
-- threshold (nil: none will).
local function plan_backups(prefix, want, inst, now, taken, served)
  local picks, stale, soonest = {}, {}, nil
  if want <= 0 then return picks, stale, soonest end
  local listed = rcall('ZRANGE', K.speculating, 0, SPEC_SCAN - 1, 'WITHSCORES')
  local thresholds, started = {}, {}
  for i = 1, #listed, 2 do
    if #picks >= want then break end
    local ref, since = listed[i], tonumber(listed[i + 1])
    local tid, inc, idx = split_ref(ref)
    local holder = rcall('HGET', K.active, ref)
    local t = tid and rcall('HMGET', task_key(prefix, tid, ''), 'state', 'seq', 'cursor', 'total', 'speculate', 'spec_started', 'inc', 'max_running', 'group', 'kind')
    if taken[ref] then
      -- taken again by this very claim (requeued since): listed anew, not stale
    elseif not holder or not t or t[2] ~= inc or t[1] ~= 'running' or not tonumber(idx) then
      stale[#stale + 1] = ref
    elseif string.match(holder, '^(.*):[^:]*$') ~= inst and t[3] == t[4] and not t[8]
      and (not served or (t[10] and served[t[10]]))
      and not (t[9] and rcall('HEXISTS', K.meta, 'group_max:' .. t[9]) == 1) and not backup_of(ref) then
      -- (a task with a cap, its own or its group's, gets none: a cap guards what its handlers use)
      started[tid] = started[tid] or tonumber(t[6] or '0')
      if started[tid] < tonumber(t[5] or '0') then
        if thresholds[tid] == nil then thresholds[tid] = spec_threshold(prefix, tid) or false end
        local th = thresholds[tid]
        if th and now - since >= th then
          local st = rcall('HMGET', task_key(prefix, tid, ':shards'), idx .. ':attempt', idx .. ':fails')
          picks[#picks + 1] = {
            ref, tid, idx, t[7] or '', now - since, math.floor(th), tonumber(st[1] or '1'), tonumber(st[2] or '0'),
          }
          started[tid] = started[tid] + 1
        elseif th and (not soonest or since + th < soonest) then
          soonest = math.ceil(since + th)
        end
      end
    end
  end
  return picks, stale, soonest
end

-- Starts the backups `plan_backups` picked, under `token`: each shard's second attempt, out of
-- `speculating` (a shard gets one backup, ever), counted in its task's `spec_started`.
local function start_backups(prefix, picks, token)
  for _, p in ipairs(picks) do
    rcall('HSETNX', K.backups, p[1], token)
    rcall('ZREM', K.speculating, p[1])
    rcall('HINCRBY', task_key(prefix, p[2], ''), 'spec_started', 1)
    emit('event', 'shard_speculated', 'task', p[2], 'shard', p[3], 'running_ms', p[5], 'threshold_ms', p[6])
  end
end
