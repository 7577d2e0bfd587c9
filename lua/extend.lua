--[[
  The heartbeat: keeps every shard one executor holds, in one call. The shards are held by
  their tokens in `active`; the executor's lease (its entry in `leases`, scored by its expiry on
  Redis's clock) says it is alive. Normally this only extends the lease. If the lease had expired
  (the executor froze or lost Redis past lockDuration), the call must carry the held (ref, token)
  pairs: it keeps the shards still held by their tokens (the sweep has not recovered them yet),
  takes the lease again, and reports the others as lost.

  KEYS[1] leases  zset  instance -> lease expiry (ms)
  KEYS[2] active  hash  ref -> token
  KEYS[3] meta    hash  `cancels`
  KEYS[4] backups hash  ref -> token of the shard's backup attempt
  ARGV[1] instance
  ARGV[2] lock_ms
  ARGV[3] mode      `beat`, or `check` to compare the tokens even if the lease lived (after a
                    claim had to take a lapsed lease again, or tasks were cancelled)
  ARGV[4] cancels   the `cancels` count the executor saw last
  ARGV[5..] ref, token pairs (only needed when the lease expired, or to check)

  Returns { status, cancels, ... }: status 0 and the 1-based pair numbers of the lost shards,
  negated for a shard of a cancelled, halted or settled task, or of a task with `--speculate`
  that ended by its other attempt (docs/design/speculation.md) (none when all is kept), or status
  -1 when the lease expired or tasks were cancelled and no pairs were given (call again with
  them, in `check` mode). A backup attempt is held by its token in `backups`.

  include: clock, task
]]
local inst, lock_ms, mode, seen = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = now_ms()
local cancels = rcall('HGET', K.meta, 'cancels') or '0'
local score = rcall('ZSCORE', K.leases, inst)
local live = score and tonumber(score) > now
if live and mode ~= 'check' then
  rcall('ZADD', K.leases, now + lock_ms, inst)
  if cancels == seen then return { 0, cancels } end
  return { -1, cancels }
end
if #ARGV < 5 then
  if mode == 'check' then
    rcall('ZADD', K.leases, now + lock_ms, inst)
    return { 0, cancels }
  end
  return { -1, cancels }
end
local refs = {}
for i = 5, #ARGV, 2 do refs[#refs + 1] = ARGV[i] end
-- the queue's key prefix `{P:Q}:`, from the meta key's name
local prefix = string.sub(K.meta, 1, #K.meta - #'meta')
local lost = { 0, cancels }
for s = 1, #refs, 4000 do
  local cur = rcall('HMGET', K.active, unpack(refs, s, math.min(s + 3999, #refs)))
  for j = 1, #cur do
    local pair = s + j - 1
    if cur[j] ~= ARGV[2 * pair + 4] and rcall('HGET', K.backups, refs[pair]) ~= ARGV[2 * pair + 4] then
      -- cancelled: the ref's own incarnation of its task is (not a later one under the id), or
      -- it halted or settled (docs/design/failure-policies.md): its shards were stopped, not lost
      local tid, inc, idx = split_ref(refs[pair])
      local t = tid and rcall('HMGET', task_key(prefix, tid, ''), 'state', 'seq', 'halted', 'cancelled', 'speculate')
      -- a shard of a task with backups whose other attempt finished first
      -- (docs/design/speculation.md) was stopped too
      local ended = t and t[5] and idx ~= 'agg' and tonumber(idx)
        and rcall('GETBIT', task_key(prefix, tid, ':terminal'), idx) == 1
      -- (a settled task's aggregation job is its own: lost, not cancelled)
      if t and (t[1] == 'cancelled' or t[3] or (t[4] and idx ~= 'agg') or ended) and t[2] == inc then
        lost[#lost + 1] = -pair
      else
        lost[#lost + 1] = pair
      end
    end
  end
end
rcall('ZADD', K.leases, now + lock_ms, inst)
return lost
