--[[
  Token-bucket limiter: a bucket of `capacity` tokens refilled at `rate` tokens per second; a
  grant takes one. Bursts up to the capacity, long-run rate at most `rate`.

  KEYS[1] bucket hash    tokens, ts (ms of the last refill)
  ARGV[1] capacity
  ARGV[2] rate        tokens per second (may be fractional)

  Returns { granted (1/0), wait_ms until a token is there when refused, the time decided at (Redis's clock, ms) }.

  include: clock
]]
local capacity, rate, now = tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms()
local b = rcall('HMGET', K.bucket, 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if not tokens then tokens, ts = capacity, now end
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate / 1000)
  ts = now
end
local granted, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  granted = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
-- tokens are kept as text with enough digits: a float reply would be truncated
rcall('HSET', K.bucket, 'tokens', string.format('%.6f', tokens), 'ts', string.format('%d', ts))
rcall('PEXPIRE', K.bucket, math.ceil(capacity * 1000 / rate) + 1000)
return { granted, wait, now }
