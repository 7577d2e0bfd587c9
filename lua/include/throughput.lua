--[[
  Completions over time (docs/design/dashboard.md, "Where time goes"): each task's series in its
  task hash, `tp<i>` the shards completed in bucket i, which spans [tp_t0 + i·tp_w, + tp_w) ms by
  Redis's clock. It starts at 1 s buckets at the task's first completion; when a completion
  falls past the last of TP_BUCKETS buckets, neighbours merge and the width doubles. So a task
  of any length keeps at most TP_BUCKETS + 2 fields, and the merge runs once per doubling.
]]
local TP_BUCKETS = 64

-- Adds `n` completions at `now` to the series of the task whose hash is `tkey`, whose `tp_t0`
-- and `tp_w` are `t0` and `w` as read (the caller reads them). Returns them as they are now.
local function add_throughput(tkey, n, now, t0, w)
  if n <= 0 then return t0, w end
  t0, w = tonumber(t0), tonumber(w)
  if not t0 or not w then
    t0, w = now - now % 1000, 1000
    rcall('HSET', tkey, 'tp_t0', t0, 'tp_w', w)
  end
  -- (a clock that went back, after a failover, counts in the first bucket)
  local i = math.max(0, math.floor((now - t0) / w))
  if i >= TP_BUCKETS then
    local old = {}
    for j = 0, TP_BUCKETS - 1 do old[#old + 1] = 'tp' .. j end
    while i >= TP_BUCKETS do
      local v = rcall('HMGET', tkey, unpack(old))
      local merged = {}
      for j = 0, TP_BUCKETS / 2 - 1 do
        local c = tonumber(v[2 * j + 1] or '0') + tonumber(v[2 * j + 2] or '0')
        if c > 0 then
          merged[#merged + 1] = 'tp' .. j
          merged[#merged + 1] = c
        end
      end
      rcall('HDEL', tkey, unpack(old))
      if #merged > 0 then rcall('HSET', tkey, unpack(merged)) end
      w = w * 2
      i = math.floor((now - t0) / w)
    end
    rcall('HSET', tkey, 'tp_w', w)
  end
  rcall('HINCRBY', tkey, 'tp' .. i, n)
  return t0, w
end
