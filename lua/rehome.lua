--[[
  Moves the first k refs of a list to the lists of their owners under the current ring (the
  rebalancer computed them): a departed node's list, a live node's list after a membership
  change (a ref whose owner is unchanged goes to the back of its own list), or `reroute`.
  Applies only if the list still starts with exactly those refs.

  KEYS[1] source       list
  KEYS[2] routed-nodes set
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] k
  ARGV[3..2+k]      the refs expected at the head of the source
  ARGV[3+k..2+2k]   the node id each goes to

  Returns k, or -7 (the head changed: read it again).
]]
local prefix, k = ARGV[1], tonumber(ARGV[2])
if k == 0 then return 0 end
local head = rcall('LRANGE', K.source, 0, k - 1)
if #head ~= k then return -7 end
for i = 1, k do
  if head[i] ~= ARGV[2 + i] then return -7 end
end
rcall('LTRIM', K.source, k, -1)
local woken = {}
for i = 1, k do
  local node = ARGV[2 + k + i]
  rcall('RPUSH', prefix .. 'node:' .. node .. ':wait', ARGV[2 + i])
  if not woken[node] then
    woken[node] = true
    rcall('SADD', K.routed_nodes, node)
    rcall('ZADD', prefix .. 'node:' .. node .. ':marker', 0, '0')
  end
end
return k
