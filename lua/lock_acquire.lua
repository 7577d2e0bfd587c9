--[[
  Takes a named lock (SET NX PX with a random token) and, with it, the next fencing token: a
  number that rises with every acquisition, so that a resource guarded by the lock can refuse
  writes from a holder whose lock has since expired.

  KEYS[1] lock  string PX token of the holder
  KEYS[2] fence string  the last fencing token handed out
  ARGV[1] token           random per acquisition
  ARGV[2] ttl_ms

  Returns the fencing token (≥ 1), or 0 when the lock is held.
]]
if not rcall('SET', K.lock, ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
return rcall('INCR', K.fence)
