--[[
  Holding a shard: `active` maps a ref to its holder's token; a shard taken back is requeued.

  include: task, lanes
]]
-- A permanent field of `active` whose value is longer than 64 bytes: it keeps the hash in
-- hashtable encoding (Redis never converts back), where HSET/HDEL cost O(1) per field instead of
-- a scan of a listpack that would be re-created each time the hash empties. Never a ref.
local ACTIVE_PIN = '~pin'

local ACTIVE_PIN_VALUE = 'keeps this hash in hashtable encoding (a value over 64 bytes); not a shard'

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
