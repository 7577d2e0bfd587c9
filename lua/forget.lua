--[[
  Forgets a departed node once its routed list is empty (atomically, so that a ref pushed to the
  list meanwhile is never stranded outside `routed-nodes`).

  KEYS[1] node:<n>:wait  list
  KEYS[2] routed-nodes   set
  KEYS[3] node:<n>:marker zset
  ARGV[1] node id

  Returns 1 when forgotten, 0 when the list still holds refs.
]]
if rcall('LLEN', KEYS[1]) > 0 then return 0 end
rcall('SREM', KEYS[2], ARGV[1])
rcall('DEL', KEYS[3])
return 1
