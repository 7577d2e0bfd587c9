//! Placement of shard keys on executors, pure (no Redis): a consistent-hash ring with virtual
//! nodes, plus the static strategies kept for comparison. The same membership always gives the
//! same placement, on every process.
//!
//! The ring hashes `"<node>#<i>"` for i in 0..vnodes with md5 (first 8 bytes, big-endian) and
//! finds a key's owner by binary search for the first point at or after md5(key), wrapping.
//! When a node joins or leaves, only the keys it owns or now owns move: about 1/N of them.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

/// Default virtual nodes per member.
pub const DEFAULT_VNODES: u32 = 150;

/// The 64-bit ring position of a string.
pub fn hash(s: &str) -> u64 {
    let d = Md5::digest(s.as_bytes());
    u64::from_be_bytes(d[..8].try_into().expect("md5 has 16 bytes"))
}

/// A consistent-hash ring over a set of members.
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<(u64, u32)>,
    nodes: Vec<String>,
}

impl Ring {
    /// A ring of `nodes` (order and duplicates do not matter) with `vnodes` points each.
    pub fn new<S: AsRef<str>>(nodes: impl IntoIterator<Item = S>, vnodes: u32) -> Self {
        let nodes: Vec<String> =
            nodes.into_iter().map(|n| n.as_ref().to_owned()).collect::<BTreeSet<_>>().into_iter().collect();
        let vnodes = vnodes.max(1);
        let mut points = Vec::with_capacity(nodes.len() * vnodes as usize);
        for (i, n) in nodes.iter().enumerate() {
            for v in 0..vnodes {
                points.push((hash(&format!("{n}#{v}")), i as u32));
            }
        }
        // ties (astronomically rare) are broken by node order, so every process agrees
        points.sort_unstable();
        Ring { points, nodes }
    }

    /// The members, sorted.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// True when the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The member that owns `key`; `None` on an empty ring.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.owner_of_hash(hash(key))
    }

    /// The member that owns ring position `h`.
    pub fn owner_of_hash(&self, h: u64) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|&(p, _)| p < h);
        let (_, n) = self.points[if i == self.points.len() { 0 } else { i }];
        Some(&self.nodes[n as usize])
    }
}

/// How shards are placed on executors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Competitive pull from the task's cursor (no placement).
    #[default]
    Pull,
    /// md5 of the key on a ring of virtual nodes.
    ConsistentHash,
    /// Shard index modulo the member count, over the sorted members.
    RoundRobin,
    /// md5 of the key modulo the member count.
    HashMod,
}

impl Strategy {
    /// The routed strategies, in the order `ring simulate` prints them.
    pub const ROUTED: [Strategy; 3] = [Strategy::ConsistentHash, Strategy::RoundRobin, Strategy::HashMod];

    /// The name used on the command line and in Redis.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Pull => "pull",
            Strategy::ConsistentHash => "consistent-hash",
            Strategy::RoundRobin => "round-robin",
            Strategy::HashMod => "hash-mod",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "pull" => Strategy::Pull,
            "consistent-hash" => Strategy::ConsistentHash,
            "round-robin" => Strategy::RoundRobin,
            "hash-mod" => Strategy::HashMod,
            _ => return Err(format!("unknown strategy '{s}': pull, consistent-hash, round-robin or hash-mod")),
        })
    }
}

/// Places keys by one routed strategy over one membership.
#[derive(Debug, Clone)]
pub struct Placement {
    strategy: Strategy,
    ring: Ring,
}

impl Placement {
    /// A placement over `nodes`; `vnodes` matters for the ring only.
    pub fn new<S: AsRef<str>>(strategy: Strategy, nodes: impl IntoIterator<Item = S>, vnodes: u32) -> Self {
        let vnodes = if strategy == Strategy::ConsistentHash { vnodes } else { 1 };
        Placement { strategy, ring: Ring::new(nodes, vnodes) }
    }

    /// The members.
    pub fn nodes(&self) -> &[String] {
        self.ring.nodes()
    }

    /// The owner of shard `index` with key `key`; `None` without members or for `pull`.
    pub fn owner(&self, index: u64, key: &str) -> Option<&str> {
        let nodes = self.ring.nodes();
        if nodes.is_empty() {
            return None;
        }
        match self.strategy {
            Strategy::Pull => None,
            Strategy::ConsistentHash => self.ring.owner(key),
            Strategy::RoundRobin => Some(&nodes[(index % nodes.len() as u64) as usize]),
            Strategy::HashMod => Some(&nodes[(hash(key) % nodes.len() as u64) as usize]),
        }
    }
}

/// What `ring simulate` measures for one strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// The strategy.
    pub strategy: Strategy,
    /// Fewest keys on one member, before the change.
    pub min: u64,
    /// Mean keys per member, before the change.
    pub mean: f64,
    /// Most keys on one member, before the change.
    pub max: u64,
    /// Fraction of keys whose owner changed.
    pub moved: f64,
    /// Keys that moved between two members present before and after (should be none).
    pub moved_between_stayers: u64,
}

/// Places `keys` keys (`"0"`, `"1"`, …) on `nodes` members, then adds `add` and removes `remove`
/// members, and measures balance and movement for each routed strategy.
pub fn simulate(nodes: usize, add: usize, remove: usize, keys: u64, vnodes: u32) -> Vec<Simulation> {
    let before: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let after: Vec<String> = before
        .iter()
        .skip(remove.min(nodes))
        .cloned()
        .chain((nodes..nodes + add).map(|i| format!("node-{i}")))
        .collect();
    Strategy::ROUTED
        .iter()
        .map(|&s| {
            let p0 = Placement::new(s, &before, vnodes);
            let p1 = Placement::new(s, &after, vnodes);
            let mut counts = std::collections::HashMap::<&str, u64>::new();
            let (mut moved, mut between) = (0u64, 0u64);
            for i in 0..keys {
                let k = i.to_string();
                let a = p0.owner(i, &k);
                let b = p1.owner(i, &k);
                if let Some(a) = a {
                    *counts.entry(a).or_default() += 1;
                }
                if a != b {
                    moved += 1;
                    if a.is_some_and(|a| after.iter().any(|n| n == a))
                        && b.is_some_and(|b| before.iter().any(|n| n == b))
                    {
                        between += 1;
                    }
                }
            }
            let per: Vec<u64> = before.iter().map(|n| counts.get(n.as_str()).copied().unwrap_or(0)).collect();
            Simulation {
                strategy: s,
                min: per.iter().copied().min().unwrap_or(0),
                mean: if per.is_empty() { 0.0 } else { keys as f64 / per.len() as f64 },
                max: per.iter().copied().max().unwrap_or(0),
                moved: if keys == 0 { 0.0 } else { moved as f64 / keys as f64 },
                moved_between_stayers: between,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("host-{i}-{}", 1000 + i * 7)).collect()
    }

    #[test]
    fn every_key_maps_to_a_live_member_and_is_deterministic() {
        let nodes = members(7);
        let a = Ring::new(&nodes, DEFAULT_VNODES);
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        let b = Ring::new(&shuffled, DEFAULT_VNODES);
        for i in 0..20_000 {
            let k = format!("key-{i}");
            let o = a.owner(&k).unwrap();
            assert!(nodes.iter().any(|n| n == o));
            assert_eq!(b.owner(&k), Some(o), "membership order must not matter");
        }
        assert_eq!(Ring::new(Vec::<String>::new(), 150).owner("x"), None);
    }

    #[test]
    fn busiest_of_ten_holds_at_most_125_percent_of_the_mean() {
        let ring = Ring::new(members(10), DEFAULT_VNODES);
        let mut counts = std::collections::HashMap::new();
        for i in 0..100_000u64 {
            *counts.entry(ring.owner(&i.to_string()).unwrap().to_owned()).or_insert(0u64) += 1;
        }
        let max = *counts.values().max().unwrap() as f64;
        assert_eq!(counts.len(), 10);
        assert!(max <= 1.25 * 10_000.0, "busiest holds {max} keys, mean 10000");
    }

    fn movement(before: &[String], after: &[String]) -> (f64, u64) {
        let (r0, r1) = (Ring::new(before, DEFAULT_VNODES), Ring::new(after, DEFAULT_VNODES));
        let (mut moved, mut between) = (0u64, 0u64);
        let keys = 100_000u64;
        for i in 0..keys {
            let k = i.to_string();
            let (a, b) = (r0.owner(&k).unwrap(), r1.owner(&k).unwrap());
            if a != b {
                moved += 1;
                if after.iter().any(|n| n == a) && before.iter().any(|n| n == b) {
                    between += 1;
                }
            }
        }
        (moved as f64 / keys as f64, between)
    }

    #[test]
    fn adding_or_removing_one_member_moves_about_one_nth() {
        for n in [3usize, 5, 8, 10] {
            let nodes = members(n + 1);
            let (small, big) = (&nodes[..n], &nodes[..]);
            // join: N → N+1 moves about 1/(N+1); leave: N+1 → N the same keys back
            for (before, after, expect) in [(small, big, 1.0 / (n + 1) as f64), (big, small, 1.0 / (n + 1) as f64)] {
                let (moved, between) = movement(before, after);
                assert!(
                    (moved - expect).abs() <= 0.3 * expect,
                    "{} -> {} members moved {moved:.4}, expected {expect:.4} ± 30%",
                    before.len(),
                    after.len()
                );
                assert_eq!(between, 0, "keys moved between members that both stayed");
            }
            // removing one from the middle
            let mut without = big.to_vec();
            without.remove(n / 2);
            let (moved, between) = movement(big, &without);
            let expect = 1.0 / (n + 1) as f64;
            assert!((moved - expect).abs() <= 0.3 * expect, "moved {moved:.4}, expected {expect:.4}");
            assert_eq!(between, 0);
        }
    }

    #[test]
    fn static_strategies_and_simulation() {
        let p = Placement::new(Strategy::RoundRobin, ["b", "a", "c"], 150);
        assert_eq!(p.owner(0, "x"), Some("a"));
        assert_eq!(p.owner(4, "x"), Some("b"));
        let sims = simulate(3, 1, 0, 30_000, DEFAULT_VNODES);
        let ch = &sims[0];
        assert_eq!(ch.strategy, Strategy::ConsistentHash);
        assert!(ch.moved < 0.35 && ch.moved_between_stayers == 0, "{ch:?}");
        // modulo placement reshuffles most keys on a change: why the ring exists
        assert!(sims[1].moved > 0.5 && sims[2].moved > 0.5, "{sims:?}");
        assert_eq!("consistent-hash".parse::<Strategy>().unwrap(), Strategy::ConsistentHash);
        assert!("ring".parse::<Strategy>().unwrap_err().contains("unknown strategy"));
    }
}
