--[[
  Shards' run times (docs/design/dashboard.md, "Where time goes"): each task's histogram in its
  task hash, `h<b>` the run times in bucket b = floor(log_1.25(ms + 1)), `h_sum` their total and
  `h_max` the longest; a task of any size keeps about 100 fields.
]]
local DUR_STEP = 1.25
-- the longest run time taken (ms, about 35 years): a bigger number is a client's mistake
local DUR_MAX_MS = 2 ^ 40

-- Adds the run times `ms` (numbers, ms, of shards just counted) to the histogram of the task
-- whose hash is `tkey`: one HINCRBY per bucket they fall in.
local function add_durations(tkey, ms)
  if #ms == 0 then return end
  local buckets, sum, max = {}, 0, -1
  for _, m in ipairs(ms) do
    local b = math.floor(math.log(m + 1) / math.log(DUR_STEP))
    buckets[b] = (buckets[b] or 0) + 1
    sum = sum + m
    if m > max then max = m end
  end
  for b, n in pairs(buckets) do rcall('HINCRBY', tkey, 'h' .. b, n) end
  rcall('HINCRBY', tkey, 'h_sum', sum)
  if max > tonumber(rcall('HGET', tkey, 'h_max') or '-1') then rcall('HSET', tkey, 'h_max', max) end
end

-- A run time as given (ms, an integer from 0 to DUR_MAX_MS), or nil (none given, or malformed).
local function duration_of(text)
  local m = tonumber(text)
  if not m or m < 0 or m > DUR_MAX_MS or m ~= math.floor(m) then return nil end
  return m
end
