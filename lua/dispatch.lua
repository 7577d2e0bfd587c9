--[[
  Creates a task. Pull tasks store no per-shard data: executors take indexes from `cursor`.
  Routed tasks (strategy other than pull) wait in `unrouted` until route.lua has placed them.
  A task with a start time in the future waits in `scheduled` (state `delayed`) until a claim
  or the coordinator starts it (lib.lua start_due_tasks); blocked executors learn the time.

  KEYS[1] task:<id>   hash    the task (must not exist)
  KEYS[2] tasks       zset    runnable tasks, by priority then submission
  KEYS[3] index       zset    every task, by creation time (status, clean)
  KEYS[4] meta        hash    queue metadata; `seq` orders submissions
  KEYS[5] unrouted    zset    routed tasks not yet fully placed
  KEYS[6] running     zset    tasks not finished, by creation time
  KEYS[7] scheduled   zset    delayed tasks, by start time
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] now_ms
  ARGV[4] priority    integer, higher first
  ARGV[5] start_ms    claimable from then on (0: at once)
  ARGV[6..] field, value pairs of the task hash

  Returns 1, or -4 (task exists), -8 (invalid spec: over 2^32 shards or |priority| > 10^6).
]]
if rcall('EXISTS', KEYS[1]) == 1 then return -4 end
local prefix, tid, now, priority, start = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- the terminal bitmap addresses 2^32 bits; |priority| <= 10^6 keeps the score below 2^53
if math.abs(priority) > 1000000 then return -8 end
for i = 6, #ARGV - 1, 2 do
  if ARGV[i] == 'total' and tonumber(ARGV[i + 1]) > 4294967296 then
    return -8
  end
end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
rcall('HSET', KEYS[1], 'state', 'running', 'cursor', 0, 'done', 0, 'failed', 0, 'created_ms', now,
  unpack(fields))
local seq = rcall('HINCRBY', KEYS[4], 'seq', 1)
rcall('HSET', KEYS[1], 'seq', seq)
rcall('ZADD', KEYS[3], now, tid)
rcall('ZADD', KEYS[6], now, tid)
local pull = rcall('HGET', KEYS[1], 'strategy') == 'pull'
if not pull then
  -- routed: placed chunk by chunk (route.lua) by the dispatcher or, if it dies, a rebalancer
  rcall('HSET', KEYS[1], 'cursor', rcall('HGET', KEYS[1], 'total'), 'routed', 0)
end
if start > now then
  rcall('HSET', KEYS[1], 'state', 'delayed', 'start_ms', start)
  rcall('ZADD', KEYS[7], start, tid)
  rcall('ZADD', prefix .. 'marker', 'LT', start, 'delayed')
elseif pull then
  rcall('ZADD', KEYS[2], runnable_score(priority, seq), tid)
  wake(prefix)
else
  rcall('ZADD', KEYS[5], now, tid)
end
local t = rcall('HMGET', KEYS[1], 'kind', 'total')
emit(prefix, 'event', 'task_dispatched', 'task', tid, 'kind', t[1], 'total', t[2])
return 1
