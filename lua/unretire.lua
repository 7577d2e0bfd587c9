--[[
  Forgets a retired partition once `clean` removed its keys: takes its tag out of the home's
  `retired_tags`, atomically against layout.lua (which adds the tags a change retires, and
  never chooses a tag still listed; docs/design/partitions-repair.md).

  KEYS[1] meta hash  queue metadata: `retired_tags`
  ARGV[1] the tag

  Returns 1 forgotten, 0 not listed.
]]
local kept, found = {}, 0
for t in string.gmatch(rcall('HGET', K.meta, 'retired_tags') or '', '%S+') do
  if t == ARGV[1] then found = 1 else kept[#kept + 1] = t end
end
if found == 1 then rcall('HSET', K.meta, 'retired_tags', table.concat(kept, ' ')) end
return found
