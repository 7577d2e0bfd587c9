--[[
  The stalled-shard sweep of Bull, at most once per interval across all executors:
  confirm the refs marked by the last sweep (still active, still no lock) as stalled, then mark
  the active refs whose lock is gone now. A stalled ref goes back to `wait` (or, for a
  routed task, to `reroute`) with its stalled count raised; past max_stalled it fails for good.

  KEYS[1] stalled-check  string PX   the throttle
  KEYS[2] stalled        set         candidates of the last sweep
  KEYS[3] active         zset
  KEYS[4] wait           list
  KEYS[5] reroute        list        recovered refs of routed tasks (placed by the current ring)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] now_ms
  ARGV[3] interval_ms
  ARGV[4] max_stalled   stalls a shard may survive
  ARGV[5] reason        failure reason past the cap

  Returns { recovered, failed, marked }, or { -1 } when another sweep ran within the interval.
]]
local prefix, now, interval, max_stalled, reason = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
if not rcall('SET', KEYS[1], now, 'NX', 'PX', interval) then return { -1 } end

local recovered, failed = 0, 0
local candidates = rcall('SMEMBERS', KEYS[2])
rcall('DEL', KEYS[2])
for _, ref in ipairs(candidates) do
  if rcall('ZSCORE', KEYS[3], ref) and rcall('EXISTS', prefix .. 'lock:' .. ref) == 0 then
    rcall('ZREM', KEYS[3], ref)
    local tid, idx = split_ref(ref)
    local skey = prefix .. 'shard:' .. ref
    if rcall('EXISTS', prefix .. 'task:' .. tid) == 0 then
      rcall('DEL', skey)
    elseif rcall('HINCRBY', skey, 'stalled', 1) > max_stalled then
      rcall('DEL', skey)
      if idx == 'agg' then
        finish_task(prefix, tid, false, reason, now)
      else
        mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now)
      end
      failed = failed + 1
    else
      rcall('HSETNX', skey, 'attempt', 1)
      if idx ~= 'agg' and rcall('HGET', prefix .. 'task:' .. tid, 'strategy') ~= 'pull' then
        rcall('RPUSH', KEYS[5], ref)
      else
        rcall('RPUSH', KEYS[4], ref)
      end
      recovered = recovered + 1
    end
  end
end
if recovered > 0 then wake(prefix) end

local marked = 0
local active = rcall('ZRANGE', KEYS[3], 0, -1)
for _, ref in ipairs(active) do
  if rcall('EXISTS', prefix .. 'lock:' .. ref) == 0 then
    rcall('SADD', KEYS[2], ref)
    marked = marked + 1
  end
end
return { recovered, failed, marked }
