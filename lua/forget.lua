--[[
  Forgets a departed node once its routed list is empty (atomically, so that a ref pushed to the
  list meanwhile is never stranded outside `routed-nodes`).

  KEYS[1] node:<n>:wait   list
  KEYS[2] routed-nodes    set
  KEYS[3] node:<n>:marker zset
  ARGV[1] node id

  Returns 1 when forgotten, 0 when the list still holds refs.
]]
if rcall('LLEN', K.node_wait) > 0 then return 0 end
rcall('SREM', K.routed_nodes, ARGV[1])
rcall('DEL', K.node_marker)
return 1
