--[[
  The event log.
]]
-- Appends to the event log (best effort, capped); nothing counts from it.
local function emit(...)
  local maxlen = rcall('HGET', K.meta, 'events_maxlen') or '10000'
  if maxlen ~= '0' then
    rcall('XADD', K.events, 'MAXLEN', '~', maxlen, '*', ...)
  end
end
