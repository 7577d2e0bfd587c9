--[[
  Sets the queue's partition layout (`shardctl config --partitions`), the only writer of it
  (docs/design/partitions-repair.md): a compare-and-set against the tags the caller read,
  refused while a task over partitions is unfinished (its shares must be served where they
  are). create_task (lib.lua) refuses a home record over tags other than the current ones, so
  with this script no unfinished share ever lies in a retired partition.

  KEYS[1] meta     hash  queue metadata: `partitions`, `partition_tags`, `retired_tags`
  KEYS[2] running  zset  tasks not finished (running, delayed, aggregating)
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] the tags the caller read, space-separated ('' for one partition)
  ARGV[3] K, the new partition count
  ARGV[4] the new tags, space-separated ('' for K = 1)
  ARGV[5] the retired tags, space-separated
  ARGV[6] `check`: only say whether it would be set (the caller prepares the new partitions'
          settings between the check and the set, and writes nothing when refused); `set`

  Returns {1} set (or would be), {-12} the layout changed since it was read, {-13, task id}
  that task runs over partitions.

  include: task
]]
local prefix = ARGV[1]
if (rcall('HGET', K.meta, 'partition_tags') or '') ~= ARGV[2] then return {-12} end
for _, tid in ipairs(rcall('ZRANGE', K.running, 0, -1)) do
  if rcall('HEXISTS', task_key(prefix, tid, ''), 'partitions') == 1 then return {-13, tid} end
end
if ARGV[6] == 'check' then return {1} end
rcall('HSET', K.meta, 'partitions', ARGV[3], 'partition_tags', ARGV[4], 'retired_tags', ARGV[5])
return {1}
