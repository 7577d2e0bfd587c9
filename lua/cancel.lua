--[[
  Cancels a task: no shard of it is claimed again, its running shards lose their tokens (their
  executors learn it at their next heartbeat, see extend.lua, and stop the handlers), and it
  ends `cancelled` without aggregation. Its refs waiting out a retry backoff leave `delayed` now;
  refs of it still queued in `wait`, node lists or `reroute` are dropped by the claim that meets
  them (claim.lua try_ref). Its per-shard state (`task:<id>:shards`) goes now. Nothing here is
  proportional to the queued work: only `active` and `delayed` are read.

  KEYS[1] task:<id>   hash
  KEYS[2] active      hash    ref -> token
  KEYS[3] meta        hash    `cancels` counts cancellations (executors watch it)
  KEYS[4] stalled     set
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id

  Returns how many running shards were stopped, or -3 (task missing), -9 (task already ended).
]]
local prefix, tid, now = ARGV[1], ARGV[2], now_ms()
local state = rcall('HGET', KEYS[1], 'state')
if not state then return -3 end
if state == 'completed' or state == 'failed' or state == 'cancelled' then return -9 end
for _, set in ipairs({ 'tasks', 'unrouted', 'scheduled' }) do rcall('ZREM', prefix .. set, tid) end
local pre = tid .. ':'
local stopped = {}
for _, ref in ipairs(rcall('HKEYS', KEYS[2])) do
  if string.sub(ref, 1, #pre) == pre then stopped[#stopped + 1] = ref end
end
if #stopped > 0 then
  call_chunked('HDEL', KEYS[2], stopped)
  call_chunked('SREM', KEYS[4], stopped)
end
-- retries in their backoff: out of `delayed` (no executor wakes for them)
local gone = {}
for _, ref in ipairs(rcall('ZRANGE', prefix .. 'delayed', 0, -1)) do
  if string.sub(ref, 1, #pre) == pre then gone[#gone + 1] = ref end
end
if #gone > 0 then call_chunked('ZREM', prefix .. 'delayed', gone) end
rcall('DEL', shards_key(prefix, tid))
rcall('HINCRBY', KEYS[3], 'cancels', 1)
end_task(prefix, tid, 'cancelled', now)
return #stopped
