//! Partitions of a queue (ARCHITECTURE.md, "Partitioned queues"): partition p (1 ≤ p ≤ K) of
//! queue Q under prefix P is the keyspace of the hash tag `P:Q@p.s`, `s` a salt chosen once so
//! that the partitions land on distinct masters of a cluster while there are enough. `@` cannot
//! occur in a queue or prefix name, so no partition's tag is another queue's.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::slot::key_slot;

/// Most partitions of a queue.
pub const MAX_PARTITIONS: u32 = 64;

/// The hash tag (without braces) of partition `p` of `queue` under `prefix`, with salt `salt`.
pub fn tag(prefix: &str, queue: &str, p: u32, salt: u32) -> String {
    format!("{prefix}:{queue}@{p}.{salt}")
}

/// Checks a partition count: 1 (no partitions: today's layout) to [`MAX_PARTITIONS`].
pub fn validate_count(k: u32) -> Result<()> {
    if (1..=MAX_PARTITIONS).contains(&k) {
        Ok(())
    } else {
        Err(Error::invalid(format!("partitions must be 1 to {MAX_PARTITIONS}, got {k}")))
    }
}

/// The tags of partitions 1..=`k`. `owner` names the master serving a slot (`None`: one server,
/// where every salt is 0). On a cluster each partition in turn takes the smallest salt whose
/// slot's master holds the fewest partitions so far, the home's master counting as holding one
/// (it carries the queue-wide keys), ties to the master listed first in `masters`.
pub fn choose_tags(
    prefix: &str,
    queue: &str,
    k: u32,
    masters: &[String],
    owner: impl Fn(u16) -> Option<String>,
) -> Result<Vec<String>> {
    validate_count(k)?;
    if k == 1 {
        return Ok(Vec::new());
    }
    let home = owner(key_slot(&format!("{{{prefix}:{queue}}}")));
    let Some(home) = home else {
        return Ok((1..=k).map(|p| tag(prefix, queue, p, 0)).collect());
    };
    let mut held: BTreeMap<&str, u32> = masters.iter().map(|m| (m.as_str(), 0)).collect();
    if let Some(h) = held.get_mut(home.as_str()) {
        *h += 1;
    }
    let mut out = Vec::new();
    for p in 1..=k {
        let least = masters.iter().map(|m| held[m.as_str()]).min().unwrap_or(0);
        let target = masters.iter().find(|m| held[m.as_str()] == least).cloned();
        let mut chosen = None;
        // each salt lands on a master with probability about 1/masters: a few tries suffice
        for salt in 0..100_000 {
            let t = tag(prefix, queue, p, salt);
            let slot_owner = owner(key_slot(&format!("{{{t}}}")));
            if target.is_none() || slot_owner == target {
                chosen = Some((t, slot_owner));
                break;
            }
        }
        let (t, slot_owner) = chosen.ok_or_else(|| Error::Protocol("no salt reaches the chosen master".into()))?;
        if let Some(h) = slot_owner.as_deref().and_then(|o| held.get_mut(o)) {
            *h += 1;
        }
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three masters owning thirds of the slots.
    fn thirds(slot: u16) -> Option<String> {
        Some(["a", "b", "c"][(slot as usize * 3) / 16384].to_owned())
    }

    #[test]
    fn one_partition_is_the_unpartitioned_queue() {
        assert!(choose_tags("shardctl", "q", 1, &[], |_| None).unwrap().is_empty());
        assert!(validate_count(0).is_err() && validate_count(65).is_err() && validate_count(64).is_ok());
    }

    #[test]
    fn on_one_server_every_salt_is_zero() {
        let tags = choose_tags("shardctl", "q", 3, &[], |_| None).unwrap();
        assert_eq!(tags, ["shardctl:q@1.0", "shardctl:q@2.0", "shardctl:q@3.0"]);
    }

    #[test]
    fn on_a_cluster_partitions_land_on_distinct_masters_home_last() {
        let masters: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let home = thirds(key_slot("{shardctl:q}")).unwrap();
        for k in [2u32, 3, 6] {
            let tags = choose_tags("shardctl", "q", k, &masters, thirds).unwrap();
            assert_eq!(tags.len(), k as usize);
            let owners: Vec<String> = tags.iter().map(|t| thirds(key_slot(&format!("{{{t}}}"))).unwrap()).collect();
            let mut count: BTreeMap<&str, u32> = BTreeMap::new();
            for o in &owners {
                *count.entry(o.as_str()).or_default() += 1;
            }
            // the home's master counts one: the others fill first, then all evenly
            let with_home = |m: &str| count.get(m).copied().unwrap_or(0) + u32::from(m == home);
            let (lo, hi) = (
                masters.iter().map(|m| with_home(m)).min().unwrap(),
                masters.iter().map(|m| with_home(m)).max().unwrap(),
            );
            assert!(hi - lo <= 1, "k={k}: {owners:?} (home on {home})");
            if k == 2 {
                assert!(!owners.contains(&home), "k=2 keeps the home's master free: {owners:?}");
            }
            // distinct tags, none a queue name's tag
            assert!(tags.iter().all(|t| t.contains('@')));
        }
    }
}
