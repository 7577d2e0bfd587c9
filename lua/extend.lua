--[[
  The heartbeat: extends every lock one executor holds, in one call.

  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] lock_ms     new time to live of each lock
  ARGV[3..] ref, token pairs

  Returns the 1-based positions (pair numbers) of the refs whose lock is lost:
  missing or held by another token. Their handlers must stop.
]]
local prefix, lock_ms = ARGV[1], ARGV[2]
local lost = {}
local pair = 0
for i = 3, #ARGV, 2 do
  pair = pair + 1
  local key = prefix .. 'lock:' .. ARGV[i]
  if rcall('GET', key) == ARGV[i + 1] then
    rcall('PEXPIRE', key, lock_ms)
  else
    lost[#lost + 1] = pair
  end
end
return lost
