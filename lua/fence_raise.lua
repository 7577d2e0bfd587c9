--[[
  Redlock's fencing: raises a server's fence to at least ARGV[1] and returns its value. The
  holder of a Redlock quorum reads the highest fence of its quorum, adds one, and raises every
  quorum server to it; two quorums share a server, so the next holder reads at least this value.

  KEYS[1] the fence   string
  ARGV[1] at least    integer (0 to only read)

  Returns the fence after raising.
]]
local cur = tonumber(rcall('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > cur then
  rcall('SET', KEYS[1], want)
  return want
end
return cur
