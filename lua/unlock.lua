--[[
  Releases a lock only if the caller's token still holds it (compare and delete).

  KEYS[1] the lock    string
  ARGV[1] token

  Returns 1 when released, 0 when the token no longer held it.
]]
if rcall('GET', KEYS[1]) == ARGV[1] then
  rcall('DEL', KEYS[1])
  return 1
end
return 0
