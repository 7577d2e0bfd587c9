--[[
  Redlock's fencing: raises a server's fence to at least ARGV[1] and returns its value. The
  holder of a Redlock quorum takes the highest fence its quorum's `lock_acquire.lua` calls
  returned and raises every quorum server to it, before it checks its validity; two quorums
  share a server, so the next holder's `INCR` there returns more than this value.

  KEYS[1] fence string
  ARGV[1] at least    integer (0 to only read)

  Returns the fence after raising.
]]
local cur = tonumber(rcall('GET', K.fence) or '0')
local want = tonumber(ARGV[1])
if want > cur then
  rcall('SET', K.fence, want)
  return want
end
return cur
