--[[
  Gives claimed shards back without failing them (graceful shutdown), each only if its token
  still holds it: to the front of `wait`, claimable at once, or, for a routed task, to `reroute`
  for the current ring to place. The next claim raises `attempt` (it counts claims); `fails` is
  left alone.

  KEYS[1] active  hash    ref -> token
  KEYS[2] stalled set
  KEYS[3] wait    list
  KEYS[4] reroute list    where released refs of routed tasks go
  KEYS[5] marker  zset    wakes blocked executors
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2..] groups of 2: ref, token

  Returns one code per group: 1 released, -1 lock missing, -2 lock mismatch.
]]
local prefix = ARGV[1]
local codes = {}
local released = 0
for i = 2, #ARGV, 2 do
  local ref, token = ARGV[i], ARGV[i + 1]
  local code = holds(ref, token)
  if code == 0 then
    -- a ref of another incarnation is let go, not requeued
    if requeue(prefix, ref, true) then released = released + 1 end
    rcall('HDEL', K.active, ref)
    rcall('SREM', K.stalled, ref)
    code = 1
  end
  codes[#codes + 1] = code
end
if released > 0 then wake() end
return codes
