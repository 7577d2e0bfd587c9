--[[
  What becomes due on Redis's clock: delayed tasks start, delayed retries come back.

  include: task, lanes, events, chunked
]]
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
