--[[
  The lease under which a dispatch over partitions creates its shares (ARCHITECTURE.md, "One
  task, one identity across slots"): renews the home record's `dispatch_until` (server time +
  the lease), or, once every share exists, sets `dispatched` and drops the lease. Only for the
  incarnation the dispatcher created or resumed: a home removed or dispatched again meanwhile
  is not touched (a plain HSET would make a stub record of a removed one).

  KEYS[1] task:<id> hash  the home record
  ARGV[1] the home's incarnation id (`inc`)
  ARGV[2] `renew` or `done`
  ARGV[3] the lease (ms), for `renew`

  Returns 1 done, 0 the home is gone or another incarnation.
]]
if rcall('HGET', K.task, 'inc') ~= ARGV[1] then return 0 end
if ARGV[2] == 'done' then
  rcall('HSET', K.task, 'dispatched', 1)
  rcall('HDEL', K.task, 'dispatch_until')
elseif rcall('HEXISTS', K.task, 'dispatched') == 0 then
  rcall('HSET', K.task, 'dispatch_until', now_ms() + tonumber(ARGV[3]))
end
return 1
