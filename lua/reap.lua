--[[
  Reaps departed executors, atomically: every node whose membership score (alive until, by
  Redis's clock) has passed leaves `nodes` and its `node:<n>` hash goes, in the same call that
  judged it, so that a node beating in between can never be removed while alive. Its routed list
  stays for the rebalancer to move (it finds departed nodes through `routed-nodes`).

  KEYS[1] nodes zset    node id -> alive until (ms)
  KEYS[2] meta  hash    queue metadata: `last_left_ms`, when the last departed one was last heard of
  ARGV[1] key prefix  `{P:Q}:` (the `node:<n>` hashes are derived from it: one per node)

  Returns { departed node ids..., '', live node ids... } (both sorted by score).

  include: clock
]]
local prefix, now = ARGV[1], now_ms()
local out = rcall('ZRANGEBYSCORE', K.nodes, '-inf', now, 'WITHSCORES')
local departed = {}
for i = 1, #out, 2 do
  departed[#departed + 1] = out[i]
  -- when the last of them was last heard of: its "alive until" less its own timeout
  local seen = tonumber(out[i + 1]) - tonumber(rcall('HGET', prefix .. 'node:' .. out[i], 'timeout_ms') or '0')
  if seen > tonumber(rcall('HGET', K.meta, 'last_left_ms') or '0') then
    rcall('HSET', K.meta, 'last_left_ms', seen)
  end
end
out = departed
for _, n in ipairs(out) do
  rcall('ZREM', K.nodes, n)
  rcall('DEL', prefix .. 'node:' .. n)
end
out[#out + 1] = ''
for _, n in ipairs(rcall('ZRANGEBYSCORE', K.nodes, '(' .. now, '+inf')) do out[#out + 1] = n end
return out
