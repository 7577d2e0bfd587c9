--[[
  Places one chunk [from, to) of a routed task's shards on their nodes' lists. The task's
  `routed` field is the placement cursor: a chunk applies only if it starts there, so a dispatcher
  and a rebalancer racing over the same task never place a shard twice, and a dispatcher killed
  mid-way leaves a task that either of them completes.

  KEYS[1] task:<id>    hash    `routed`, `total`
  KEYS[2] unrouted     zset    routed tasks not yet fully placed
  KEYS[3] routed-nodes set     nodes that may have a list
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] from        first shard index of the chunk
  ARGV[4] node count  k, then k node ids, then one node number (1..k) per shard of the chunk

  Returns the new `routed` value, or -3 (task missing), -6 (routed moved: read it again), -9
  (task cancelled or ended, or delayed: nothing to place now).
]]
local prefix, tid, from, k = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local routed = rcall('HGET', K.task, 'routed')
if not routed then return -3 end
-- a cancelled task places nothing more; a delayed one is placed once it starts
local state = rcall('HGET', K.task, 'state')
if state == 'cancelled' or state == 'delayed' then
  if state == 'cancelled' then rcall('ZREM', K.unrouted, tid) end
  return -9
end
if tonumber(routed) ~= from then return -6 end
-- nor does one that ended, or settled (halted, k-of-n: docs/design/failure-policies.md)
if state == 'failed' or state == 'completed' or rcall('HEXISTS', K.task, 'cancelled') == 1 then
  rcall('ZREM', K.unrouted, tid)
  return -9
end
local lists = {}
for j = 1, k do lists[j] = {} end
local n = #ARGV - 4 - k
-- refs carry the task's incarnation (lib.lua split_ref)
local pre = tid .. ':' .. rcall('HGET', K.task, 'seq') .. ':'
for i = 1, n do
  local j = tonumber(ARGV[4 + k + i])
  local l = lists[j]
  l[#l + 1] = pre .. (from + i - 1)
end
for j = 1, k do
  local node = ARGV[4 + j]
  local l = lists[j]
  if #l > 0 then
    local key = prefix .. 'node:' .. node .. ':wait'
    for s = 1, #l, 4000 do
      rcall('RPUSH', key, unpack(l, s, math.min(s + 3999, #l)))
    end
    rcall('SADD', K.routed_nodes, node)
    rcall('ZADD', prefix .. 'node:' .. node .. ':marker', 0, '0')
  end
end
local to = from + n
rcall('HSET', K.task, 'routed', to)
if to >= tonumber(rcall('HGET', K.task, 'total')) then rcall('ZREM', K.unrouted, tid) end
return to
