--[[
  Reaps departed executors, atomically: every node whose membership score (alive until, by
  Redis's clock) has passed leaves `nodes` and its `node:<n>` hash goes, in the same call that
  judged it, so that a node beating in between can never be removed while alive. Its routed list
  stays for the rebalancer to move (it finds departed nodes through `routed-nodes`).

  KEYS[1] nodes zset    node id -> alive until (ms)
  ARGV[1] key prefix  `{P:Q}:` (the `node:<n>` hashes are derived from it: one per node)

  Returns { departed node ids..., '', live node ids... } (both sorted by score).
]]
local prefix, now = ARGV[1], now_ms()
local out = rcall('ZRANGEBYSCORE', K.nodes, '-inf', now)
for _, n in ipairs(out) do
  rcall('ZREM', K.nodes, n)
  rcall('DEL', prefix .. 'node:' .. n)
end
out[#out + 1] = ''
for _, n in ipairs(rcall('ZRANGEBYSCORE', K.nodes, '(' .. now, '+inf')) do out[#out + 1] = n end
return out
