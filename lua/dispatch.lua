--[[
  Creates a task. Pull tasks store no per-shard data: executors take indexes from `cursor`.
  Routed tasks (strategy other than pull) wait in `unrouted` until route.lua has placed them.
  A task with a start time in the future waits in `scheduled` (state `delayed`) until a claim
  or the coordinator starts it (lib.lua start_due_tasks); blocked executors learn the time.

  KEYS[1]  task:<id>          hash   the task (must not exist)
  KEYS[2]  kinds              set    kinds that may have a lane (docs/design/lanes.md)
  KEYS[3]  index              zset   every task, by creation time (status, clean)
  KEYS[4]  meta               hash   queue metadata; `seq` orders submissions
  KEYS[5]  unrouted           zset   routed tasks not yet fully placed
  KEYS[6]  running            zset   tasks not finished, by creation time
  KEYS[7]  scheduled          zset   delayed tasks, by start time
  KEYS[8]  task:<id>:terminal bitmap of this task
  KEYS[9]  task:<id>:results  hash   of this task
  KEYS[10] task:<id>:errors   hash   of this task
  KEYS[11] task:<id>:shards   hash   of this task
  KEYS[12] events             stream the event log
  KEYS[13] expiring           zset   ended tasks with a retention, by expiry time
  KEYS[14] finished           zset   ended tasks, by end time
  KEYS[15] marker             zset   wakes blocked executors
  KEYS[16] held               hash   held shards per task (a new task's count starts at 0)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] task id
  ARGV[3] priority    integer, higher first
  ARGV[4] delay_ms    claimable this long after the dispatch (0: at once), by Redis's clock
  ARGV[5..] field, value pairs of the task hash

  Returns 1, or -4 (task exists), -8 (invalid spec: over 2^32 shards or |priority| > 10^6),
  -12 (a home record over partitions whose `partition_tags` are no longer the queue's).
  The work is lib.lua create_task (schedules create tasks the same way, see fire.lua).

  include: clock, create
]]
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local now = now_ms()
local delay = tonumber(ARGV[4])
return create_task(ARGV[1], ARGV[2], now, tonumber(ARGV[3]), delay > 0 and now + delay or 0, fields)
