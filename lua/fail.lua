--[[
  Records failed attempts of claimed shards (and aggregation jobs), each only if its token still
  holds it. With attempts left the ref waits in `delayed` for its backoff; otherwise it is
  terminal and counted as failed with its reason (an aggregation job fails its task).

  KEYS[1] active      hash    ref -> token
  KEYS[2] stalled     set
  KEYS[3] delayed     zset    ref -> due time
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] now_ms
  ARGV[3] node        the failing executor's node: a routed shard's retry goes back to it
  ARGV[4..] groups of 5: ref, token, attempt (of this claim), delay_ms (backoff before the next
            attempt), reason

  Returns one code per group: 2 retry scheduled, 1 failed for good (counted), 0 failed for good
  but already terminal, -1 lock missing, -2 lock mismatch, -3 task missing.
]]
local prefix, now, node = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local codes = {}
for i = 4, #ARGV, 5 do
  local ref, token, attempt, delay, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4]
  -- a failed shard always has a reason: `retry` finds the failed shards by it
  if reason == '' then reason = 'failed' end
  local code = take(prefix, ref, token)
  if code == 0 then
    rcall('SREM', KEYS[2], ref)
    local tid, idx = split_ref(ref)
    local tkey = prefix .. 'task:' .. tid
    local skey = prefix .. 'shard:' .. ref
    local max = tonumber(rcall('HGET', tkey, 'attempts') or '0')
    if max == 0 then
      rcall('DEL', skey)
      code = -3
    else
      local fails = rcall('HINCRBY', skey, 'fails', 1)
      if fails < max then
        rcall('HSET', skey, 'attempt', attempt)
        if idx ~= 'agg' and rcall('HGET', tkey, 'strategy') ~= 'pull' then rcall('HSET', skey, 'node', node) end
        if idx ~= 'agg' then rcall('HSET', tkey .. ':errors', idx, reason) end
        local due = now + delay
        rcall('ZADD', KEYS[3], due, ref)
        -- blocked executors learn the due time and wake for it
        rcall('ZADD', prefix .. 'marker', 'LT', due, 'delayed')
        emit(prefix, 'event', 'shard_retried', 'task', tid, 'shard', idx, 'attempt', attempt, 'reason', reason)
        code = 2
      else
        rcall('DEL', skey)
        if idx == 'agg' then
          code = finish_task(prefix, tid, false, reason, now)
        else
          code = mark_terminal(prefix, tid, tonumber(idx), 'failed', 'errors', reason, now)
        end
      end
    end
  end
  codes[#codes + 1] = code
end
return codes
