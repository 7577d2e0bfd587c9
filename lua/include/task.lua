--[[
  A task's keys and identity (docs/design/declared-keys.md). The registry
  (common/src/scripts/registry.rs) puts a preamble before the includes, made from the script's
  header: `K` maps each declared key's name to its key (`K.wait`, `K.node_wait` for
  `node:<n>:wait`, `K.task` for `task:<id>`), in the order of the script's KEYS, and raises on a
  name the header does not declare; `DECLARED` is the set of declared key strings; `TASK_ANCHOR`
  is the declared `task:<id>` of a single-task script, or nil. Queue-level keys are only ever
  reached through `K`. Keys of a task are built by `task_key`: in a single-task script, every key
  of its own task must be declared too; multi-task scripts (claim, complete, ...) derive them
  from the prefix, in the queue's slot. Per-node keys (`node:<n>:*`) are derived the same way.
  Also a shard's ref, its task's incarnation, and its per-shard state.
]]
local function task_key(prefix, tid, suffix)
  local k = prefix .. 'task:' .. tid .. suffix
  if TASK_ANCHOR and TASK_ANCHOR == prefix .. 'task:' .. tid and not DECLARED[k] then
    error('shardctl: key ' .. k .. ' is not declared by this script')
  end
  return k
end

-- Splits a shard ref `<task>:<seq>:<index>` (or `<task>:<seq>:agg`): task id, incarnation
-- (the task's `seq`), index. Task ids have no colon (common::names).
local function split_ref(ref)
  return string.match(ref, '^([^:]+):(%d+):([^:]+)$')
end

-- Every key a task owns, as suffixes of `task:<id>` (the same list as Keys::task_keys).
local TASK_SUFFIXES = { '', ':terminal', ':results', ':errors', ':keys', ':shards' }

-- Every key a task owns (the same list as common::keys::Keys::task_keys).
local function task_keys(prefix, tid)
  local ks = {}
  for i, sfx in ipairs(TASK_SUFFIXES) do ks[i] = task_key(prefix, tid, sfx) end
  return ks
end

-- True when `ref` belongs to the current incarnation of its task (the task exists and its
-- `seq` is the ref's): anything else is left over from an earlier task under the same id.
local function current(prefix, tid, inc)
  return tid ~= nil and rcall('HGET', task_key(prefix, tid, ''), 'seq') == inc
end

-- The hash of a task's per-shard state: `<index>:attempt`, `:fails`, `:stalled`, `:node`,
-- `:defers` (and `agg:*`), only for shards that were claimed more than once, failed, stalled,
-- deferred or routed back.
local function shards_key(prefix, tid)
  return task_key(prefix, tid, ':shards')
end

-- Forgets one shard's state.
local function drop_state(prefix, tid, idx)
  rcall('HDEL', shards_key(prefix, tid), idx .. ':attempt', idx .. ':fails', idx .. ':stalled', idx .. ':node', idx .. ':defers')
end

-- Keeps in the task's `attempt_hw` the highest attempt number a handler of it has seen (a
-- failure, a deferral, a stall, a stop): a retry numbers its attempts past it (lua/retry.lua), as
-- deferrals and stalls may pass `attempts`.
local function raise_attempt_hw(prefix, tid, attempt)
  local tkey = task_key(prefix, tid, '')
  local a = tonumber(attempt)
  if a and a > tonumber(rcall('HGET', tkey, 'attempt_hw') or '0') then rcall('HSET', tkey, 'attempt_hw', a) end
end
