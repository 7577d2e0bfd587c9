--[[
  Removes ended tasks and every key they own: those whose retention has run out (`expiring`,
  by expiry time; their keys may already have expired) and, when asked, every task that ended
  at or before a cutoff (`shardctl clean --older-than`). At most `limit` tasks per call.

  KEYS[1] finished    zset    ended tasks, by end time
  KEYS[2] expiring    zset    ended tasks with a retention, by expiry time
  KEYS[3] index       zset    every task
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] now_ms
  ARGV[3] cutoff_ms   remove tasks ended at or before this; -1: only expired ones
  ARGV[4] limit

  Returns how many tasks were removed.
]]
local prefix, now, cutoff, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local victims = rcall('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
if cutoff >= 0 and #victims < limit then
  for _, tid in ipairs(rcall('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, limit - #victims)) do
    victims[#victims + 1] = tid
  end
end
local removed, seen = 0, {}
for _, tid in ipairs(victims) do
  if not seen[tid] then
    seen[tid] = true
    rcall('ZREM', KEYS[1], tid)
    local keys = task_keys(prefix, tid)
    rcall('DEL', unpack(keys))
    rcall('ZREM', KEYS[2], tid)
    rcall('ZREM', KEYS[3], tid)
    removed = removed + 1
  end
end
return removed
