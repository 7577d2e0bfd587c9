--[[
  Moves due retries from `delayed` to their lanes' waits (a routed shard's to its node's list) and wakes
  executors (the coordinator's duty; claims
  promote too, so this only matters while every executor is busy or asleep).

  KEYS[1] delayed      zset   ref -> due time
  KEYS[2] kinds        set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[3] events       stream the event log
  KEYS[4] marker       zset   wakes blocked executors
  KEYS[5] meta         hash   queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[6] routed-nodes set    nodes that may have a routed list
  KEYS[7] scheduled    zset   delayed tasks, by start time
  KEYS[8] unrouted     zset   routed tasks not fully placed
  ARGV[1] key prefix  `{P:Q}:`

  Returns how many were moved (at most 1000 per call).

  include: clock, due
]]
return promote_due(ARGV[1], now_ms())
