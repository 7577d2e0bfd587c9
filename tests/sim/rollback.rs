//! The rollback fault, shared by both simulators: an asynchronous-replication failover of ONE
//! slot. After every step each slot (hash tag) is snapshotted server-side: every key starting
//! with `{tag}:` is copied (COPY, which keeps its expiry) under `~rb:<serial>:<key>`, and the
//! copied names are listed in the set `~rb:<serial>`. A rollback deletes every current key of
//! the tag and copies the snapshot's keys back, in one script (atomic against the simulator's
//! own steps); every other slot keeps its state. A small ring of snapshots is kept per slot,
//! each with a payload of the caller's (what its model knew at that instant), so that a
//! rollback `back` steps restores the keys and hands back the model of the same instant.
//! Snapshot names start with `~rb:`, so no key pattern of a queue (`{tag}:*`) ever meets them.

use std::collections::VecDeque;
use std::sync::LazyLock;

use shardctl_common::conn::Conn;

/// ARGV: triples (key prefix `{tag}:`, new serial, serial to drop or ""). Copies each prefix's
/// keys under the new serial, and drops the snapshot the ring lets go.
static SNAPSHOT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local function glob(s) return (s:gsub('[%*%?%[%]\\]', '\\%0')) end
local n = 0
for i = 1, #ARGV, 3 do
  local pre, serial, drop = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if drop ~= '' then
    for _, k in ipairs(redis.call('SMEMBERS', '~rb:' .. drop)) do redis.call('DEL', '~rb:' .. drop .. ':' .. k) end
    redis.call('DEL', '~rb:' .. drop)
  end
  redis.call('SADD', '~rb:' .. serial, '')
  for _, k in ipairs(redis.call('KEYS', glob(pre) .. '*')) do
    redis.call('COPY', k, '~rb:' .. serial .. ':' .. k, 'REPLACE')
    redis.call('SADD', '~rb:' .. serial, k)
    n = n + 1
  end
end
return n
",
    )
});

/// ARGV: the key prefix, the serial to restore, then serials to drop (the lost future).
static RESTORE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local function glob(s) return (s:gsub('[%*%?%[%]\\]', '\\%0')) end
local pre, serial = ARGV[1], ARGV[2]
local gone = 0
for _, k in ipairs(redis.call('KEYS', glob(pre) .. '*')) do gone = gone + redis.call('DEL', k) end
local back = 0
for _, k in ipairs(redis.call('SMEMBERS', '~rb:' .. serial)) do
  if k ~= '' then back = back + redis.call('COPY', '~rb:' .. serial .. ':' .. k, k, 'REPLACE') end
end
for i = 3, #ARGV do
  for _, k in ipairs(redis.call('SMEMBERS', '~rb:' .. ARGV[i])) do redis.call('DEL', '~rb:' .. ARGV[i] .. ':' .. k) end
  redis.call('DEL', '~rb:' .. ARGV[i])
end
return {gone, back}
",
    )
});

/// The snapshots of each slot, newest last, each with its payload.
pub struct Rollbacks<T> {
    /// Key prefix `{tag}:` of each slot.
    prefixes: Vec<String>,
    rings: Vec<VecDeque<(u64, T)>>,
    depth: usize,
    next: u64,
}

impl<T: Clone> Rollbacks<T> {
    /// Rings of `depth` snapshots for the slots with these key prefixes (`{tag}:`).
    pub fn new(prefixes: Vec<String>, depth: usize) -> Self {
        let rings = prefixes.iter().map(|_| VecDeque::new()).collect();
        Rollbacks { prefixes, rings, depth, next: 0 }
    }

    /// Snapshots every slot (one round trip), slot `i` with payload `payloads[i]`.
    pub async fn snapshot(&mut self, con: &mut Conn, payloads: Vec<T>) -> Result<(), String> {
        let mut inv = SNAPSHOT.prepare_invoke();
        for (slot, payload) in payloads.into_iter().enumerate() {
            self.next += 1;
            let ring = &mut self.rings[slot];
            let drop = if ring.len() >= self.depth { ring.pop_front().map(|(s, _)| s.to_string()) } else { None };
            inv.arg(&self.prefixes[slot]).arg(self.next).arg(drop.unwrap_or_default());
            ring.push_back((self.next, payload));
        }
        let _: u64 = inv.invoke_async(con).await.map_err(|e| format!("rollback snapshot: {e}"))?;
        Ok(())
    }

    /// How many snapshots of `slot` a rollback may go back to (1: the state after the last step).
    pub fn available(&self, slot: usize) -> usize {
        self.rings[slot].len()
    }

    /// The serial of `slot`'s newest snapshot (0: none yet).
    #[allow(dead_code)] // the one-slot simulator's durability (tests/sim/durable.rs) only
    pub fn newest(&self, slot: usize) -> u64 {
        self.rings[slot].back().map_or(0, |(s, _)| *s)
    }

    /// How many snapshots of `slot` a rollback may go back to without going behind snapshot
    /// `serial` (a state a replica acknowledged: `tests/sim/durable.rs`).
    #[allow(dead_code)] // the one-slot simulator only
    pub fn available_since(&self, slot: usize, serial: u64) -> usize {
        self.rings[slot].iter().filter(|(s, _)| *s >= serial).count()
    }

    /// Restores `slot` to its snapshot `back` steps ago (1 ..= `available`): only that slot's
    /// keys change. The snapshots after it are dropped (a future no replica has); it stays the
    /// newest. Returns its payload and (keys deleted, keys restored).
    pub async fn restore(&mut self, con: &mut Conn, slot: usize, back: usize) -> Result<(T, (u64, u64)), String> {
        let ring = &mut self.rings[slot];
        assert!((1..=ring.len()).contains(&back), "rollback {back} steps back of {}", ring.len());
        let lost: Vec<u64> = ring.drain(ring.len() - back + 1..).map(|(s, _)| s).collect();
        let (serial, payload) = ring.back().cloned().expect("a snapshot");
        let mut inv = RESTORE.prepare_invoke();
        inv.arg(&self.prefixes[slot]).arg(serial);
        for s in lost {
            inv.arg(s);
        }
        let (gone, back): (u64, u64) = inv.invoke_async(con).await.map_err(|e| format!("rollback restore: {e}"))?;
        Ok((payload, (gone, back)))
    }
}
