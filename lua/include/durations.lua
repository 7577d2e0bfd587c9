--[[
  Shards' run times (docs/design/dashboard.md, "Where time goes"): each task's histogram in its
  task hash, `h<b>` the run times in bucket b = floor(log_1.25(ms + 1)) (0 to 124: the caller
  computes b, `common/src/durations.rs::bucket`) and `h_max` the longest; a task of any size
  keeps at most 126 fields.
]]

-- Adds the run times of shards just counted, as their buckets `buckets`, to the histogram of
-- the task whose hash is `tkey`: one HINCRBY per bucket they fall in. `longest` (ms, text) is
-- the longest of them when it was counted (else nil: then the lower bound of their highest
-- bucket stands for it), `max_before` the task's `h_max` as read (the caller reads it).
-- Returns `h_max` as it is now.
local function add_durations(tkey, buckets, longest, max_before)
  if #buckets == 0 then return max_before end
  local counts, top = {}, 0
  for _, b in ipairs(buckets) do
    if b < 125 then
      counts[b] = (counts[b] or 0) + 1
      if b > top then top = b end
    end
  end
  for b, n in pairs(counts) do rcall('HINCRBY', tkey, 'h' .. b, n) end
  local max = tonumber(longest)
  if not (max and max >= 0 and max == math.floor(max)) then max = math.ceil(1.25 ^ top - 1) end
  if max > (tonumber(max_before) or -1) then
    rcall('HSET', tkey, 'h_max', string.format('%d', max))
    return max
  end
  return max_before
end
