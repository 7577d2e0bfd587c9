--[[
  Gives claimed shards back without failing them (graceful shutdown, or shards an executor
  claimed ahead and will not start soon), each only if its token still holds it: to its lane's wait,
  claimable at once (at its front, or at its back behind aggregation jobs and retries), or, for
  a routed task, to `reroute` for the current ring to place. The next claim raises `attempt` (it
  counts claims); `fails` is left alone. A shard that never started (claimed ahead) has its
  claim undone: its `attempt` goes back to what it was before that claim, so the next claim
  hands out the same number.

  KEYS[1] active  hash ref -> token
  KEYS[2] stalled set
  KEYS[3] kinds   set  kinds that may have a lane (docs/design/lanes.md)
  KEYS[4] reroute list where released refs of routed tasks go
  KEYS[5] marker  zset wakes blocked executors
  KEYS[6] held    hash held index shards per task and group (lua/include/fair.lua)
  KEYS[7] meta    hash group caps
  KEYS[8] backups hash ref -> token of the shard's backup attempt
  KEYS[9] leases zset instance -> lease expiry (a backup that takes a shard over must be alive)
  KEYS[10] speculating zset ref -> claim ms of first attempts of tasks with --speculate
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] `front` (a started shard, to the front of its lane's wait), `unstarted` (never started, to the
          front) or `back` (never started, to the back)
  ARGV[3..] groups of 2: ref, token

  Returns one code per group: 1 released, -1 lock missing, -2 lock mismatch.

  Either attempt of a shard with two (docs/design/speculation.md) goes alone while the other runs
  on: nothing is requeued.

  include: clock, fair, hold, speculate, task
]]
local prefix, front, undo = ARGV[1], ARGV[2] ~= 'back', ARGV[2] ~= 'front'
local codes = {}
local released = 0
local spec_any = rcall('EXISTS', K.backups) == 1
for i = 3, #ARGV, 2 do
  local ref, token = ARGV[i], ARGV[i + 1]
  local code = holds(ref, token)
  local backup = false
  if code ~= 0 and spec_any and backup_of(ref) == token then code, backup = 0, true end
  if code == 0 and spec_any and leave_attempt(ref, backup, now_ms()) then
    code = 1
  elseif code == 0 then
    local tid, _, idx = split_ref(ref)
    local skey, field = shards_key(prefix, tid), idx .. ':attempt'
    local before = undo and rcall('HGET', skey, field)
    -- a ref of another incarnation is let go, not requeued
    if requeue(prefix, ref, front) then
      released = released + 1
      -- a started shard's attempt was seen by its handler: a retry numbers past it
      if not undo then raise_attempt_hw(prefix, tid, rcall('HGET', skey, field) or 1) end
      if undo then
        -- the claim never started it: as if it had not been claimed (no state for a lazy shard)
        local was = tonumber(before or '1') - 1
        if was > 0 then rcall('HSET', skey, field, was) else rcall('HDEL', skey, field) end
      end
    end
    rcall('HDEL', K.active, ref)
    rcall('SREM', K.stalled, ref)
    spec_forget({ ref })
    local _, inc, idx = split_ref(ref)
    if idx ~= 'agg' then unhold(prefix, tid, inc, 1, now_ms()) end
    code = 1
  end
  codes[#codes + 1] = code
end
return codes
