--[[
  Removes the share of task `id` in a partition whose home record is gone or is another
  incarnation (docs/design/partitions.md), only if the share is still the one that
  was judged an orphan (its `home_inc` unchanged): a share of the same id dispatched again
  meanwhile stays. Keys a dispatcher wrote for a share it never created (it died before) are
  removed the same way, guarded by the `inc` field the dispatcher wrote in them.

  KEYS[1]  task:<id>          hash    the share
  KEYS[2]  task:<id>:terminal bitmap  of this share
  KEYS[3]  task:<id>:results  hash    of this share
  KEYS[4]  task:<id>:errors   hash    of this share
  KEYS[5]  task:<id>:keys     hash    of this share
  KEYS[6]  task:<id>:shards   hash    of this share
  KEYS[7]  index              zset    every task (and share) of the keyspace
  KEYS[8]  unreported         zset    shares ended, not yet counted in the home
  KEYS[9]  finished           zset    ended tasks
  KEYS[10] running            zset    tasks not finished
  KEYS[11] expiring           zset    ended tasks with a retention
  ARGV[1] key prefix  `{P:Q@p.s}:`
  ARGV[2] task id
  ARGV[3] the share's `home_inc` as read (empty: no share)
  ARGV[4] with no share, the `inc` field of its keys as read (empty: none)

  Returns 1 removed, 0 left (it changed since).

  include: lanes, task
]]
local prefix, tid = ARGV[1], ARGV[2]
local t = rcall('HMGET', K.task, 'home_inc', 'home_seq')
if (t[1] or t[2] or '') ~= ARGV[3] then return 0 end
if ARGV[3] == '' and (rcall('HGET', task_key(prefix, tid, ':keys'), 'inc') or '') ~= (ARGV[4] or '') then return 0 end
local kind = rcall('HGET', K.task, 'kind')
-- the lane first: its key is derived (an abort at it writes nothing)
if kind then rcall('ZREM', lane_key(prefix, kind, 'tasks'), tid) end
rcall('DEL', unpack(task_keys(prefix, tid)))
for _, z in ipairs({ K.index, K.unreported, K.finished, K.running, K.expiring }) do rcall('ZREM', z, tid) end
return 1
