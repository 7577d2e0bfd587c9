--[[
  Sliding-window log limiter: at most `max` grants in ANY window of `window_ms` (a log of grant
  times in a sorted set).

  KEYS[1] log zset    grant id -> grant time (ms)
  ARGV[1] max
  ARGV[2] window_ms
  ARGV[3] grant id    unique per request

  Returns { granted (1/0), wait_ms until the oldest grant leaves the window when refused, the time decided at (Redis's clock, ms) }.

  include: clock
]]
local max, window, now = tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms()
rcall('ZREMRANGEBYSCORE', K.log, '-inf', now - window)
if rcall('ZCARD', K.log) >= max then
  local oldest = rcall('ZRANGE', K.log, 0, 0, 'WITHSCORES')
  return { 0, math.max(1, tonumber(oldest[2]) + window - now + 1), now }
end
rcall('ZADD', K.log, now, ARGV[3])
rcall('PEXPIRE', K.log, window)
return { 1, 0, now }
