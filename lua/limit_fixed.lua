--[[
  Fixed-window rate limiter: at most `max` grants per aligned window of `window_ms`.

  KEYS[1] counter string  prefix: the window's counter is this key .. ':' .. window number
  ARGV[1] max
  ARGV[2] window_ms

  Returns { granted (1/0), wait_ms until the next window when refused, the time decided at (Redis's clock, ms) }.

  include: clock
]]
local max, window, now = tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms()
local n = math.floor(now / window)
local key = K.counter .. ':' .. string.format('%d', n)
local count = tonumber(rcall('GET', key) or '0')
if count >= max then return { 0, (n + 1) * window - now, now } end
rcall('INCR', key)
rcall('PEXPIRE', key, window * 2)
return { 1, 0, now }
