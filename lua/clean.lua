--[[
  Removes ended tasks and every key they own: those whose retention has run out (`expiring`,
  by expiry time; their keys may already have expired) and, when asked, every task that ended
  at or before a cutoff (`shardctl clean --older-than`). At most `limit` tasks per call.

  KEYS[1] finished zset    ended tasks, by end time
  KEYS[2] expiring zset    ended tasks with a retention, by expiry time
  KEYS[3] index    zset    every task
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] older_than_ms  also remove tasks ended at least this long ago; -1: only expired ones
  ARGV[3] limit

  An entry of a task that is not ended (a later task under the same id, dispatched after the
  earlier one's keys expired) is stale: it leaves the list and the task stays.

  Returns { entries read, tasks removed }.

  include: clock, lanes, task
]]
local prefix, now, older, limit = ARGV[1], now_ms(), tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff = -1
if older >= 0 then cutoff = now - older end
local victims, seen = {}, {}
for _, tid in ipairs(rcall('ZRANGEBYSCORE', K.expiring, '-inf', now, 'LIMIT', 0, limit)) do
  victims[#victims + 1] = tid
  seen[tid] = true
end
if cutoff >= 0 and #victims < limit then
  -- expired tasks are in `finished` too: read as many more as may be taken already, so that a
  -- full batch is removed whenever there are that many (the caller stops at a short one)
  for _, tid in ipairs(rcall('ZRANGEBYSCORE', K.finished, '-inf', cutoff, 'LIMIT', 0, limit)) do
    if #victims >= limit then break end
    if not seen[tid] then
      victims[#victims + 1] = tid
      seen[tid] = true
    end
  end
end
local removed = 0
for _, tid in ipairs(victims) do
  -- read first: an abort at a key of a slot being migrated leaves the task listed, to be
  -- cleaned by a later call
  local state = rcall('HGET', task_key(prefix, tid, ''), 'state')
  touch_task(prefix, tid)
  rcall('ZREM', K.finished, tid)
  rcall('ZREM', K.expiring, tid)
  -- listed as ended but running: a later task under the same id (the entry is stale)
  if not state or state == 'completed' or state == 'failed' or state == 'cancelled' then
    rcall('DEL', unpack(task_keys(prefix, tid)))
    rcall('ZREM', K.index, tid)
    removed = removed + 1
  end
end
return { #victims, removed }
