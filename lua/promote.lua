--[[
  Moves due retries from `delayed` to `wait` (a routed shard's to its node's list) and wakes
  executors (the coordinator's duty; claims
  promote too, so this only matters while every executor is busy or asleep).

  KEYS[1] delayed     zset    ref -> due time
  KEYS[2] wait        list
  ARGV[1] key prefix  `{P:Q}:`

  Returns how many were moved (at most 1000 per call).
]]
return promote_due(ARGV[1], now_ms())
