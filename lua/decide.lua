--[[
  The decision pass's write (coordinator/src/partition/decide.rs): the home of a running task over
  partitions halts or settles from its shares' counts read by the pass (lua/include/decide.lua,
  docs/design/failure-policies.md, Over partitions). The commit point: its shares are stopped
  after, as it says.

  KEYS[1]  task:<id>          hash   the home record
  KEYS[2]  task:<id>:terminal bitmap of this task (its retention)
  KEYS[3]  task:<id>:results  hash   of this task
  KEYS[4]  task:<id>:errors   hash   of this task
  KEYS[5]  task:<id>:keys     hash   of this task
  KEYS[6]  task:<id>:shards   hash   of this task
  KEYS[7]  events             stream the event log
  KEYS[8]  expiring           zset   ended tasks with a retention, by expiry time
  KEYS[9]  finished           zset   ended tasks, by end time
  KEYS[10] meta               hash   queue metadata (events_maxlen)
  KEYS[11] running            zset   tasks not finished
  KEYS[12] unreported         zset   (the home's) ended tasks whose shares to end or stop
  KEYS[13] scheduled          zset   delayed tasks, by start time (a halted one leaves it)
  ARGV[1] key prefix  `{P:Q}:` (the home's)
  ARGV[2] task id
  ARGV[3] the home record's incarnation id (`inc`) the pass read
  ARGV[4] the home's round the pass read
  ARGV[5] the shares' done, summed
  ARGV[6] the failed of the shares in that round, summed
  ARGV[7] the first failure, `<task index> <line>` ('' when none was read)
  ARGV[8] the first halt a handler asked for, `<task index> <line>` ('' none)
  ARGV[9] the reason of a share found halted in that round ('' none): the home lost the halt

  Returns 1 halted, 2 settled, 0 nothing decided (another incarnation or round, neither running
  nor delayed, decided before, or no limit crossed).

  include: clock, decide
]]
local prefix, tid = ARGV[1], ARGV[2]
local t = rcall('HMGET', K.task, 'inc', 'seq', 'round', 'state')
if (t[1] or t[2]) ~= ARGV[3] or (t[3] or '0') ~= ARGV[4] or (t[4] ~= 'running' and t[4] ~= 'delayed') then return 0 end
-- the first failure, for the reason shown (the home's reports may have kept one already)
if ARGV[7] ~= '' then rcall('HSETNX', K.task, 'first_failure', ARGV[7]) end
local asked = ARGV[8] ~= '' and ARGV[8] or nil
local halted = ARGV[9] ~= '' and ARGV[9] or nil
return decide_home(prefix, tid, tonumber(ARGV[5]), tonumber(ARGV[6]), asked, halted, now_ms())
