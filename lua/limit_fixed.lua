--[[
  Fixed-window rate limiter: at most `max` grants per aligned window of `window_ms`.

  KEYS[1] counter prefix   the window's counter is KEYS[1] .. ':' .. window number
  ARGV[1] max
  ARGV[2] window_ms
  ARGV[3] now_ms

  Returns { granted (1/0), wait_ms until the next window when refused }.
]]
local max, window, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = math.floor(now / window)
local key = KEYS[1] .. ':' .. string.format('%d', n)
local count = tonumber(rcall('GET', key) or '0')
if count >= max then return { 0, (n + 1) * window - now } end
rcall('INCR', key)
rcall('PEXPIRE', key, window * 2)
return { 1, 0 }
