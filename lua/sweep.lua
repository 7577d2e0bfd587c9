--[[
  The stalled-shard sweep of Bull, at most once per interval across all executors. A shard is
  stalled when its holder's lease is gone. First confirm the refs the last sweep marked (still
  held by a holder without a lease): each goes back to `wait` (or, for a routed task, to
  `reroute`) with its stalled count raised, or past max_stalled fails for good. Then mark the
  held refs whose holder has no lease now.

  KEYS[1]  stalled-check string PX the throttle
  KEYS[2]  stalled       set     candidates of the last sweep
  KEYS[3]  active        hash    ref -> token `<instance>:<seq>`
  KEYS[4]  wait          list
  KEYS[5]  reroute       list    recovered refs of routed tasks (placed by the current ring)
  KEYS[6]  events        stream  the event log
  KEYS[7]  expiring      zset    ended tasks with a retention, by expiry time
  KEYS[8]  finished      zset    ended tasks, by end time
  KEYS[9]  marker        zset    wakes blocked executors
  KEYS[10] meta          hash    queue metadata (paused, seq, cancels, limits, events_maxlen)
  KEYS[11] running       zset    tasks not finished
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] interval_ms
  ARGV[3] max_stalled   stalls a shard may survive
  ARGV[4] reason        failure reason past the cap

  Returns { recovered, failed, marked }, or { -1 } when another sweep ran within the interval.
]]
local prefix, now, interval, max_stalled, reason = ARGV[1], now_ms(), ARGV[2], tonumber(ARGV[3]), ARGV[4]
if not rcall('SET', K.stalled_check, now, 'NX', 'PX', interval) then return { -1 } end

local leases = {}
local function holder_alive(token)
  local inst = string.match(token, '^(.*):[^:]*$') or token
  local alive = leases[inst]
  if alive == nil then
    alive = rcall('EXISTS', prefix .. 'lease:' .. inst) == 1
    leases[inst] = alive
  end
  return alive
end

local recovered, failed = 0, 0
local candidates = rcall('SMEMBERS', K.stalled)
rcall('DEL', K.stalled)
for _, ref in ipairs(candidates) do
  local token = rcall('HGET', K.active, ref)
  if token and not holder_alive(token) then
    local tid, inc, idx = split_ref(ref)
    local mine = current(prefix, tid, inc)
    -- read first: an abort at a key of a slot being migrated leaves this shard held, unrecorded
    if mine then touch_task(prefix, tid) end
    if not mine then
      -- another incarnation's shard: let go, nothing recorded
    elseif rcall('HINCRBY', shards_key(prefix, tid), idx .. ':stalled', 1) > max_stalled then
      drop_state(prefix, tid, idx)
      if idx == 'agg' then
        finish_task(prefix, tid, false, reason, now)
      else
        mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now)
      end
      failed = failed + 1
    else
      requeue(prefix, ref, false)
      emit('event', 'shard_stalled', 'task', tid, 'shard', idx)
      recovered = recovered + 1
    end
    -- last: the shard leaves `active` (an abort before this leaves it held, for the next sweep)
    rcall('HDEL', K.active, ref)
  end
end
if recovered > 0 then wake() end

local marked = {}
local held = rcall('HGETALL', K.active)
for i = 1, #held, 2 do
  if held[i] ~= ACTIVE_PIN and not holder_alive(held[i + 1]) then marked[#marked + 1] = held[i] end
end
if #marked > 0 then call_chunked('SADD', K.stalled, marked) end
return { recovered, failed, #marked }
