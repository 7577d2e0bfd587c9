--[[
  Registers an executor in the membership, or refreshes its heartbeat. Refused while another
  live instance holds the same node id: two executors must not both count as that node.
  The node's score is the time it counts as alive until: its heartbeat plus its own member
  timeout, so every reader (dispatch, status, rebalancers, coordinators) judges each executor by
  the timeout it runs with.

  KEYS[1] nodes    zset    node id -> alive until (ms): last heartbeat + timeout_ms
  KEYS[2] node:<n> hash    instance, host, pid, concurrency, kinds, version, started_ms, timeout_ms
  ARGV[1] node id
  ARGV[2] instance    unique per process
  ARGV[3] timeout_ms  silent this long after a heartbeat, the node has departed
  ARGV[4] replace     an instance the caller proved dead (its process is gone: same host, same
                      boot, same pid namespace, and its pid absent or another process's), or ''
                      for none: the id is taken from that instance even while its heartbeat
                      lasts, and only from it (a takeover by another meanwhile stands)
  ARGV[5..] field, value pairs describing the executor, set when it joins; those named `live_*`
            (what it has done and runs now: docs/design/dashboard.md, "Executors") are set at
            every heartbeat, with `live_at` (now)

  Times are Redis's (TIME): a node whose own clock is off is judged like any other.

  Returns { 1 } (joined or refreshed), or { -5, host, pid, age_ms, instance, proc, left_ms } of
  the live holder (age: since its last heartbeat; proc: its process identity, `boot|pidns|start`;
  left_ms: until it counts as departed).

  include: clock
]]
local node, instance, now, timeout = ARGV[1], ARGV[2], now_ms(), tonumber(ARGV[3])
local replace = ARGV[4]
local score = rcall('ZSCORE', K.nodes, node)
local holder = rcall('HGET', K.node, 'instance')
if score and holder and holder ~= instance and tonumber(score) > now and holder ~= replace then
  local h = rcall('HMGET', K.node, 'host', 'pid', 'timeout_ms', 'proc')
  return { -5, h[1] or '', h[2] or '', now - (tonumber(score) - tonumber(h[3] or '0')), holder, h[4] or '',
    tonumber(score) - now }
end
local fields, live = {}, { 'live_at', now }
for i = 5, #ARGV - 1, 2 do
  local into = string.sub(ARGV[i], 1, 5) == 'live_' and live or fields
  into[#into + 1] = ARGV[i]
  into[#into + 1] = ARGV[i + 1]
end
if holder ~= instance then
  rcall('DEL', K.node)
  rcall('HSET', K.node, 'instance', instance, 'started_ms', now, unpack(fields))
end
rcall('HSET', K.node, 'timeout_ms', timeout, unpack(live))
rcall('ZADD', K.nodes, now + timeout, node)
return { 1 }
