--[[
  Extends a named lock if the caller's token still holds it (the watchdog's renewal).

  KEYS[1] lock string PX
  ARGV[1] token
  ARGV[2] ttl_ms

  Returns 1 when extended, 0 when the token no longer holds the lock.
]]
if rcall('GET', K.lock) ~= ARGV[1] then return 0 end
rcall('PEXPIRE', K.lock, ARGV[2])
return 1
