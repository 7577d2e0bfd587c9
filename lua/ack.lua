--[[
  Removes a share from its partition's `unreported` once report.lua counted it in the home, only
  if it is still the entry that was reported (same end time): a share that ended again since
  (a retry) stays to be reported again.

  KEYS[1] unreported zset  shares ended, not yet counted in the home (task id -> end ms)
  ARGV[1] task id
  ARGV[2] the end time that was reported

  Returns 1 removed, 0 not there or another end.
]]
if rcall('ZSCORE', K.unreported, ARGV[1]) ~= ARGV[2] then return 0 end
return rcall('ZREM', K.unreported, ARGV[1])
