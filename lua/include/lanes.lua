--[[
  Lanes (docs/design/lanes.md): what is ready to claim lives in the lane of its task's kind,
  `kind:<k>:wait` (explicit refs) and `kind:<k>:tasks` (runnable pull tasks), and
  `kind:<k>:marker` wakes the executors that serve k; `kind:*:marker` wakes those that serve
  every kind (`*` is no name character: no kind owns it). `kinds` lists the kinds that may have
  a lane; every push adds its kind, so a claim may drop a kind whose lane is empty. Lane keys are
  derived from the prefix like per-node keys: in the queue's slot, unknown to the caller. Also
  the marker that asks for routing.

  include: task, chunked
]]
local ANY_KIND_MARKER = 'kind:*:marker'

local function lane_key(prefix, kind, what)
  return prefix .. 'kind:' .. kind .. ':' .. what
end

-- Reads the lane keys of `kind` before a script writes them (see `touch_task`).
local function touch_lane(prefix, kind)
  rcall('EXISTS', lane_key(prefix, kind, 'wait'), lane_key(prefix, kind, 'tasks'), lane_key(prefix, kind, 'marker'), prefix .. ANY_KIND_MARKER)
end

-- Reads keys of task `tid` (suffixes of `task:<id>`; all of them when none are given, and then
-- its kind's lane too) before a script writes any of them: on a cluster, a key of a slot being
-- migrated that is not here any more aborts the script at this read, before anything was
-- written, instead of part-way (docs/design/declared-keys.md, order of writes).
local function touch_task(prefix, tid, suffixes)
  local ks = {}
  for i, sfx in ipairs(suffixes or TASK_SUFFIXES) do ks[i] = task_key(prefix, tid, sfx) end
  rcall('EXISTS', unpack(ks))
  if not suffixes then
    local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
    if kind then touch_lane(prefix, kind) end
  end
end

-- Reads the lane keys of task `tid`'s kind (none without a record) before a script writes any
-- key: a single-task script calls it before its first write.
local function touch_task_lane(prefix, tid)
  local kind = rcall('HGET', task_key(prefix, tid, ''), 'kind')
  if kind then touch_lane(prefix, kind) end
end

-- The score of a runnable task in `tasks`: higher priority first; among equals, first
-- dispatched first (exact: |score| < 2^53 with |priority| <= 10^6 and seq < 2^32).
local function runnable_score(priority, seq)
  return -tonumber(priority) * 4294967296 + tonumber(seq)
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

-- The longest list `list_drop_task` filters: a longer one is left to the claims that meet the
-- task's refs (a bounded script, whatever the queued work).
local LIST_FILTER_MAX = 10000

-- Takes the refs of task `tid` out of list `key` when it holds at most LIST_FILTER_MAX refs (a
-- task that ended: its refs there are no work, and the counts of waiting shards are exact at
-- once). The list is written only when it held some.
local function list_drop_task(key, tid)
  if rcall('LLEN', key) > LIST_FILTER_MAX then return end
  local pre = tid .. ':'
  local keep, dropped = {}, false
  for _, ref in ipairs(rcall('LRANGE', key, 0, -1)) do
    if string.sub(ref, 1, #pre) == pre then dropped = true else keep[#keep + 1] = ref end
  end
  if not dropped then return end
  rcall('DEL', key)
  if #keep > 0 then call_chunked('RPUSH', key, keep) end
end

-- Takes the refs of task `tid` out of the wait of lane `kind` (see `list_drop_task`).
local function lane_drop_task(prefix, kind, tid)
  list_drop_task(lane_key(prefix, kind, 'wait'), tid)
end

-- Makes pull task `tid` runnable in lane `kind`, and wakes it.
local function lane_add_task(prefix, kind, tid, priority, seq)
  rcall('SADD', K.kinds, kind)
  rcall('ZADD', lane_key(prefix, kind, 'tasks'), runnable_score(priority, seq), tid)
  wake_lane(prefix, kind)
end

-- Asks for a rebalance soon: routed work waits in `unrouted` or `reroute` for the current ring.
-- The blocked executor that pops this marker rebalances at once instead of at its next
-- membership heartbeat.
local function want_routing()
  rcall('ZADD', K.marker, 0, 'route')
end
