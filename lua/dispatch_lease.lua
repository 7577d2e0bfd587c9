--[[
  The lease under which one dispatcher at a time creates the shares of a task over partitions
  (docs/design/partitions.md). The home record holds it:
  `dispatcher` (the holder's token; the creator's is the record's nonce) and `dispatch_until`
  (server time), until `dispatched` is set once every share exists. Only for the incarnation
  the caller read: a home removed or dispatched again meanwhile is not touched (a plain HSET
  would make a stub record of a removed one).

  - `renew`: the holder extends its lease, before each share and each chunk of keys it writes.
    Refused once the lease lapsed or another took it: the holder stops writing.
  - `take`: a caller that would create missing shares (the reconciliation, a dispatch run
    again) takes the lease, which must have lapsed (or be its own already); with `dispatched`
    set there is nothing to take and the caller may create a lost share.
  - `done`: the holder marks the dispatch complete.

  KEYS[1] task:<id> hash  the home record
  ARGV[1] the home's incarnation id (`inc`)
  ARGV[2] `renew`, `take` or `done`
  ARGV[3] the caller's token
  ARGV[4] the lease (ms)

  Returns 1 granted (or complete already), 0 the home is gone or another incarnation, -1
  refused: the lease is another's (live, for `take`) or has lapsed (for `renew`).

  include: clock
]]
local mode, token, now = ARGV[2], ARGV[3], now_ms()
local t = rcall('HMGET', K.task, 'inc', 'seq', 'dispatched', 'dispatcher', 'dispatch_until')
if (t[1] or t[2]) ~= ARGV[1] then return 0 end
-- complete: nothing to take or mark; a renew means its holder lost it to whoever completed it
if t[3] then return mode == 'renew' and -1 or 1 end
local mine, live = t[4] == token, tonumber(t[5] or '0') > now
if mode == 'done' then
  if not mine then return -1 end
  rcall('HSET', K.task, 'dispatched', 1)
  rcall('HDEL', K.task, 'dispatch_until', 'dispatcher')
  return 1
end
if mode == 'renew' and not (mine and live) then return -1 end
if mode == 'take' and live and not mine then return -1 end
rcall('HSET', K.task, 'dispatcher', token, 'dispatch_until', now + tonumber(ARGV[4]))
return 1
