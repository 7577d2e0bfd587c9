--[[
  Removes an executor from the membership (graceful shutdown), if this instance still holds
  its node id. Its routed list stays until a rebalancer moves it to the new owners. `meta`
  keeps when the last executor left (`last_left_ms`: a wait with none live says so).

  KEYS[1] nodes    zset
  KEYS[2] node:<n> hash
  KEYS[3] meta     hash    queue metadata
  ARGV[1] node id
  ARGV[2] instance

  Returns 1 when removed, 0 when another instance holds the id.

  include: clock
]]
if rcall('HGET', K.node, 'instance') ~= ARGV[2] then return 0 end
rcall('ZREM', K.nodes, ARGV[1])
rcall('DEL', K.node)
rcall('HSET', K.meta, 'last_left_ms', now_ms())
return 1
