--[[
  Shards' run times (docs/design/dashboard.md, "Where time goes"): each task's histogram in its
  task hash, `h<b>` the run times in bucket b = floor(log_1.25(ms + 1)) (0 to 124: the caller
  computes b, `common/src/durations.rs::bucket`) and `h_max` the longest; a task of any size
  keeps at most 126 fields.
]]

-- Adds the run times of shards just counted, as their buckets `buckets`, to the histogram of
-- the task whose hash is `tkey`: one HINCRBY per bucket they fall in; `longest` (ms, text) is
-- the longest of them when known, `max_before` the task's `h_max` as read (the caller reads
-- it). Returns `h_max` as it is now.
local function add_durations(tkey, buckets, longest, max_before)
  if #buckets == 0 then return max_before end
  local counts = {}
  for _, b in ipairs(buckets) do
    if b < 125 then counts[b] = (counts[b] or 0) + 1 end
  end
  for b, n in pairs(counts) do rcall('HINCRBY', tkey, 'h' .. b, n) end
  local max = tonumber(longest)
  if max and max >= 0 and max == math.floor(max) and max > (tonumber(max_before) or -1) then
    rcall('HSET', tkey, 'h_max', longest)
    return longest
  end
  return max_before
end
