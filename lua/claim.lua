--[[
  Claims up to `count` shards for one executor: explicit refs first (released and aggregation
  jobs at the front, recovered and due retries at the back), then fresh indexes from the
  runnable tasks' cursors. Refs whose task is gone or that are already terminal are dropped.
  Each claimed shard gets its own token `<token_base>:<seq>` under lock:<ref> with PX lock_ms,
  and enters `active` scored by claim time.

  KEYS[1] wait        list    explicit refs ready now
  KEYS[2] tasks       zset    runnable tasks
  KEYS[3] delayed     zset    ref -> due time (ms)
  KEYS[4] active      zset    ref -> claim time (ms)
  KEYS[5] meta        hash    `paused`
  KEYS[6] node:<n>:wait list  refs routed to this executor's node
  KEYS[7] rebalancing string  while set, node lists are being re-placed: leave them alone
  ARGV[1] key prefix  `{P:Q}:`
  ARGV[2] now_ms
  ARGV[3] count       shards wanted (> 0)
  ARGV[4] lock_ms     lock duration
  ARGV[5] token_base  `<executor-uuid>`
  ARGV[6] seq         claim sequence of the first shard; shard j gets seq + j

  Returns { next, ref_1, attempt_1, fails_1, ... }: `next` is 0 when shards were claimed,
  -2 when the queue is paused, else the due time of the earliest delayed ref or -1 if none.
]]
local prefix, now, count, lock_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local token_base, seq = ARGV[5], tonumber(ARGV[6])

if rcall('HGET', KEYS[5], 'paused') == '1' then return { -2 } end

-- due retries become explicit refs
local due = rcall('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
for i = 1, #due do
  rcall('ZREM', KEYS[3], due[i])
  rcall('RPUSH', KEYS[1], due[i])
end

local out = { 0 }
local n = 0
-- refs of removed tasks or already terminal shards are dropped, at most this many per call,
-- so that one call never keeps Redis busy for long
local junk_left = 1000
local function take(ref, attempt, fails)
  -- %d, not `..`: concatenation would print a large number as 1e+14
  rcall('SET', prefix .. 'lock:' .. ref, string.format('%s:%d', token_base, seq + n), 'PX', lock_ms)
  rcall('ZADD', KEYS[4], now, ref)
  out[#out + 1] = ref
  out[#out + 1] = attempt
  out[#out + 1] = fails
  n = n + 1
end

while n < count do
  local ref = rcall('LPOP', KEYS[1])
  if not ref then break end
  local tid, idx = split_ref(ref)
  local tkey = prefix .. 'task:' .. (tid or '')
  local ok = tid and rcall('EXISTS', tkey) == 1
  if ok and idx == 'agg' then
    ok = rcall('HGET', tkey, 'state') == 'aggregating'
  elseif ok then
    ok = rcall('GETBIT', tkey .. ':terminal', idx) == 0
  end
  local skey = prefix .. 'shard:' .. ref
  if not ok then
    rcall('DEL', skey)
    junk_left = junk_left - 1
    if junk_left == 0 then break end
  else
    local attempt = rcall('HINCRBY', skey, 'attempt', 1)
    local fails = tonumber(rcall('HGET', skey, 'fails') or '0')
    take(ref, attempt, fails)
  end
end

if n < count and rcall('EXISTS', KEYS[7]) == 0 then
  while n < count do
    local ref = rcall('LPOP', KEYS[6])
    if not ref then break end
    local tid, idx = split_ref(ref)
    local tkey = prefix .. 'task:' .. (tid or '')
    local skey = prefix .. 'shard:' .. ref
    if tid and rcall('EXISTS', tkey) == 1 and rcall('GETBIT', tkey .. ':terminal', idx) == 0 then
      -- routed refs are lazy like cursor shards: state only once recovered or released
      if rcall('EXISTS', skey) == 1 then
        take(ref, rcall('HINCRBY', skey, 'attempt', 1), tonumber(rcall('HGET', skey, 'fails') or '0'))
      else
        take(ref, 1, 0)
      end
    else
      rcall('DEL', skey)
      junk_left = junk_left - 1
      if junk_left == 0 then break end
    end
  end
end

while n < count do
  local head = rcall('ZRANGE', KEYS[2], 0, 0)
  if #head == 0 then break end
  local tid = head[1]
  local tkey = prefix .. 'task:' .. tid
  local t = rcall('HMGET', tkey, 'cursor', 'total')
  if not t[1] then
    rcall('ZREM', KEYS[2], tid)
  else
    local cursor, total = tonumber(t[1]), tonumber(t[2])
    local k = math.min(count - n, total - cursor)
    if k > 0 then rcall('HINCRBY', tkey, 'cursor', k) end
    if cursor + k >= total then rcall('ZREM', KEYS[2], tid) end
    for i = cursor, cursor + k - 1 do
      take(tid .. ':' .. i, 1, 0)
    end
  end
end

-- junk left behind: make sure some executor comes back for the rest
if junk_left == 0 then wake(prefix) end
if n > 0 then
  -- pass the wake-up on to the next blocked executor while work remains
  if rcall('LLEN', KEYS[1]) > 0 or rcall('ZCARD', KEYS[2]) > 0 then wake(prefix) end
  return out
end
local first = rcall('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if #first == 0 then return { -1 } end
return { tonumber(first[2]) }
