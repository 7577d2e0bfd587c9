--[[
  Ends a share as its home ended (docs/design/partitions-repair.md, End): once the
  home record recorded the aggregation, each share of the same incarnation leaves
  `aggregating` for the home's final state and drops its per-shard results unless the task
  keeps them (the home's own end does the same in the home, end_task in lib.lua). Its keys stay
  until its home record is removed (`partition::drop_orphans`), as before.

  KEYS[1] task:<id>         hash  the share
  KEYS[2] task:<id>:results hash  of this share
  ARGV[1] key prefix  `{P:Q@p.s}:` (the partition's)
  ARGV[2] task id
  ARGV[3] the home's incarnation id the share must name (`home_inc`)
  ARGV[4] the home's final state (`completed` or `failed`)

  Returns 1 ended, 0 not this incarnation's share or not aggregating (ended before, or running
  again: the home's count of it is then forgotten by the aggregation, not here).

  include: clock, task
]]
local prefix, tid = ARGV[1], ARGV[2]
local t = rcall('HMGET', K.task, 'home_inc', 'state', 'keep_results', 'home_seq')
if (t[1] or t[4]) ~= ARGV[3] or t[2] ~= 'aggregating' then return 0 end
rcall('HSET', K.task, 'state', ARGV[4], 'finished_ms', now_ms())
-- the aggregation that meets such a share again (its home's end lost in a failover) refuses
-- it rather than read no result for every shard
if t[3] == '0' then
  rcall('DEL', task_key(prefix, tid, ':results'))
  rcall('HSET', K.task, 'results_dropped', 1)
end
return 1
