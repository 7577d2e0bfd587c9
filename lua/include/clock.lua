--[[
  The one clock: Redis's own time, read in every script that stores or compares a time.
]]
-- The one clock (docs/design/clock.md): Redis's own, in ms since the epoch. Every time a
-- script stores or compares is read here, never taken from a caller, so that executors,
-- coordinators and dispatchers with skewed clocks agree on leases, due times and membership.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
