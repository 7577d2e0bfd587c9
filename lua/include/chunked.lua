--[[
  Commands over argument lists longer than Lua's unpack takes.
]]
-- Calls `cmd key a1 a2 ...` over a long argument list in chunks (Lua's unpack has a limit).
local function call_chunked(cmd, key, args)
  for s = 1, #args, 4000 do
    rcall(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
  end
end
