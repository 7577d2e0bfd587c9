--[[
  Completes claimed shards (and aggregation jobs), each only if its token still holds the lock.
  A shard is counted once: the terminal bitmap decides (see include/lib.lua mark_terminal).
  The last terminal shard of a task enqueues `<task>:agg`; completing that records the result.

  KEYS[1] active      zset
  KEYS[2] stalled     set
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] now_ms
  ARGV[3..] groups of 4: ref, token, has_state (1 when shard:<ref> may exist), result
            (JSON text; empty when there is nothing to keep)

  Returns one code per group: 1 counted, 0 already terminal (finished twice),
  -1 lock missing, -2 lock mismatch, -3 task missing.
]]
local prefix, now = ARGV[1], tonumber(ARGV[2])
local codes = {}
for i = 3, #ARGV, 4 do
  local ref, token, has_state, result = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local code = take_lock(prefix .. 'lock:' .. ref, token)
  if code == 0 then
    rcall('ZREM', KEYS[1], ref)
    rcall('SREM', KEYS[2], ref)
    if has_state == '1' then rcall('DEL', prefix .. 'shard:' .. ref) end
    local tid, idx = split_ref(ref)
    if rcall('EXISTS', prefix .. 'task:' .. tid) == 0 then
      code = -3
    elseif idx == 'agg' then
      code = finish_task(prefix, tid, true, result, now)
    else
      code = mark_terminal(prefix, tid, tonumber(idx), 'done', 'results', result, now)
    end
  end
  codes[#codes + 1] = code
end
return codes
