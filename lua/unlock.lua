--[[
  Releases a lock only if the caller's token still holds it (compare and delete).

  KEYS[1] lock string
  ARGV[1] token

  Returns 1 when released, 0 when the token no longer held it.
]]
if rcall('GET', K.lock) == ARGV[1] then
  rcall('DEL', K.lock)
  return 1
end
return 0
