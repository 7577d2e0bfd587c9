--[[
  Gives back shards held under this executor's tokens that the executor does not know: the
  reply of the claim that took them never reached it (a connection dropped, Redis restarted, a
  reply timed out), and its live lease would keep them held forever. Each goes to the front of
  its lane's wait, or for a routed task to `reroute`, as a release would; only if the given token still
  holds it.

  KEYS[1] active  hash ref -> token
  KEYS[2] kinds   set  kinds that may have a lane (docs/design/lanes.md)
  KEYS[3] reroute list
  KEYS[4] stalled set  a given-back ref loses its stall mark
  KEYS[5] marker  zset wakes blocked executors
  KEYS[6] held    hash held index shards per task and group (lua/include/fair.lua)
  KEYS[7] meta    hash group caps
  KEYS[8] backups hash ref -> token of a shard's backup attempt (docs/design/speculation.md)
  KEYS[9] leases zset instance -> lease expiry (a backup that takes a shard over must be alive)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2..] ref, token pairs

  Returns how many shards were given back.

  include: clock, fair, hold, speculate, task
]]
local prefix = ARGV[1]
local n = 0
for i = 2, #ARGV, 2 do
  local ref, token = ARGV[i], ARGV[i + 1]
  if ref ~= ACTIVE_PIN and rcall('HGET', K.backups, ref) == token then
    -- a backup attempt (docs/design/speculation.md): it goes, its first attempt runs on
    rcall('HDEL', K.backups, ref)
    n = n + 1
  elseif ref ~= ACTIVE_PIN and rcall('HGET', K.active, ref) == token and leave_attempt(ref, false, now_ms()) then
    -- a first attempt whose backup runs on: the backup takes its place, nothing is requeued
    n = n + 1
  elseif ref ~= ACTIVE_PIN and rcall('HGET', K.active, ref) == token then
    -- a ref of another incarnation is let go, not requeued
    requeue(prefix, ref, true)
    rcall('HDEL', K.active, ref)
    rcall('SREM', K.stalled, ref)
    local tid, inc, idx = split_ref(ref)
    if tid and idx ~= 'agg' then unhold(prefix, tid, inc, 1, now_ms()) end
    n = n + 1
  end
end
return n
