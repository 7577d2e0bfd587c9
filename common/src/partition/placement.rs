//! Where partitions go: tags chosen so that partitions land on distinct masters of a cluster,
//! the count set by `config --partitions`, and the re-placement when the masters change.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::home::Home;
use crate::slot::key_slot;

use super::layout::{layout, layout_of, tag, tags_of, validate_count, Layout};

/// The master (`host:port`) serving each slot, from `CLUSTER SLOTS`; `None` on a server without
/// cluster support.
pub async fn slot_owners<C: ConnectionLike + Send>(
    con: &mut C,
) -> Result<Option<(Vec<String>, Vec<(u16, u16, String)>)>> {
    let reply: redis::RedisResult<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(con).await;
    let v = match reply {
        Ok(v) => v,
        Err(e) if e.to_string().contains("cluster support disabled") => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let redis::Value::Array(ranges) = v else { return Err(Error::Protocol("CLUSTER SLOTS: not an array".into())) };
    let mut out = Vec::new();
    let mut masters: Vec<String> = Vec::new();
    for r in ranges {
        let redis::Value::Array(r) = r else { continue };
        let (Some(redis::Value::Int(a)), Some(redis::Value::Int(b)), Some(redis::Value::Array(m))) =
            (r.first(), r.get(1), r.get(2))
        else {
            continue;
        };
        let host = match m.first() {
            Some(redis::Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(redis::Value::SimpleString(h)) => h.clone(),
            _ => continue,
        };
        let Some(redis::Value::Int(port)) = m.get(1) else { continue };
        let master = format!("{host}:{port}");
        if !masters.contains(&master) {
            masters.push(master.clone());
        }
        out.push((*a as u16, *b as u16, master));
    }
    masters.sort();
    Ok(Some((masters, out)))
}

/// Sets the queue's partition count to `k` (1 to [`MAX_PARTITIONS`](super::layout::MAX_PARTITIONS)) and returns the layout.
/// The tags are chosen from the slot map of the cluster `con` reaches when `on_cluster` (one
/// server: salt 0, and no `CLUSTER` command is sent). Refused while a task dispatched over
/// partitions is unfinished: its shares must be served where they are (`layout.lua`, the only
/// writer of the layout; docs/design/partitions-repair.md). Setting the count it has
/// keeps the stored tags. Running executors and coordinators follow within [`LAYOUT_CHECK`].
pub async fn set_count<C: ConnectionLike + Send>(con: &mut C, home: &Home, k: u32, on_cluster: bool) -> Result<Layout> {
    validate_count(k)?;
    let now = layout(con, home).await?;
    if now.count() == k {
        return Ok(now);
    }
    let (prefix, queue) = home.names();
    let owners = if on_cluster { slot_owners(con).await? } else { None };
    let retired = retired_tags(con, home).await?;
    let tags = match owners {
        None => choose_tags(prefix, queue, k, &[], &retired, |_| None)?,
        Some((masters, ranges)) => choose_tags(prefix, queue, k, &masters, &retired, |slot| owner_of(&ranges, slot))?,
    };
    apply(con, home, &now, k, tags).await
}

/// The tags of the partitions a change retired and `clean` has not yet removed.
async fn retired_tags<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Vec<String>> {
    let retired: Option<String> = redis::cmd("HGET").arg(home.meta()).arg("retired_tags").query_async(con).await?;
    Ok(retired.unwrap_or_default().split_whitespace().map(str::to_owned).collect())
}

/// The master serving `slot` in `ranges` (from [`slot_owners`]).
fn owner_of(ranges: &[(u16, u16, String)], slot: u16) -> Option<String> {
    ranges.iter().find(|(a, b, _)| (*a..=*b).contains(&slot)).map(|(_, _, m)| m.clone())
}

/// The most partitions of tags `tags` that one master holds.
fn most_on_one<'a>(tags: impl Iterator<Item = &'a str>, owner: impl Fn(u16) -> Option<String>) -> usize {
    let mut held: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for t in tags {
        *held.entry(owner(key_slot(&format!("{{{t}}}")))).or_default() += 1;
    }
    held.into_values().max().unwrap_or(0)
}

/// On a Redis Cluster, the master (`host:port`) serving each partition of `layout`, partition 1
/// first (`?` for a slot the map does not name); `None` on a server without cluster support,
/// and for a queue of one partition (nothing to place).
pub async fn masters_of<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<Option<Vec<String>>> {
    if !layout.partitioned() {
        return Ok(None);
    }
    let Some((_, ranges)) = slot_owners(con).await? else { return Ok(None) };
    Ok(Some(
        tags_of(layout)
            .split_whitespace()
            .map(|t| owner_of(&ranges, key_slot(&format!("{{{t}}}"))).unwrap_or_else(|| "?".to_owned()))
            .collect(),
    ))
}

/// On a Redis Cluster, re-places the queue's partitions when the slot map changed (masters
/// added, slots moved) so that a fresh choice of tags spreads them better: when the most
/// partitions one master holds would drop. The change is the same as a change of the count
/// (`layout.lua`; running processes follow it); refused while a task over partitions runs, or
/// when another process changed the layout meanwhile. Returns the new layout, `None` when
/// nothing changed (one server, one partition, as spread as it can be, or refused: the next
/// check tries again).
pub async fn replace_when_better<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Option<Layout>> {
    let now = layout(con, home).await?;
    if !now.partitioned() {
        return Ok(None);
    }
    let Some((masters, ranges)) = slot_owners(con).await? else { return Ok(None) };
    let stored = tags_of(&now);
    // a slot map with holes (a master failing, a migration half-seen) says nothing yet
    if stored.split_whitespace().any(|t| owner_of(&ranges, key_slot(&format!("{{{t}}}"))).is_none()) {
        return Ok(None);
    }
    let (prefix, queue) = home.names();
    let retired = retired_tags(con, home).await?;
    let fresh = choose_tags(prefix, queue, now.count(), &masters, &retired, |slot| owner_of(&ranges, slot))?;
    let before = most_on_one(stored.split_whitespace(), |slot| owner_of(&ranges, slot));
    let after = most_on_one(fresh.iter().map(String::as_str), |slot| owner_of(&ranges, slot));
    if after >= before {
        return Ok(None);
    }
    match apply(con, home, &now, now.count(), fresh).await {
        Ok(l) => Ok(Some(l)),
        Err(Error::Invalid(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes `tags` the queue's `k` partitions in place of the layout `now` it has (`layout.lua`,
/// a compare-and-set against `now`'s tags), the queue's settings copied to them first.
async fn apply<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    now: &Layout,
    k: u32,
    tags: Vec<String>,
) -> Result<Layout> {
    let layout = layout_of(home, k, &tags.join(" "))?;
    // partitions no longer in use keep the shares of ended tasks: `drop_orphans` removes them
    // with their task, then the partition's own keys
    let mut retired = retired_tags(con, home).await?;
    for old in tags_of(now).split_whitespace() {
        if !tags.iter().any(|t| t == old) && !retired.iter().any(|t| t == old) {
            retired.push(old.to_owned());
        }
    }
    let (read, new, retired) = (tags_of(now), tags.join(" "), retired.join(" "));
    let refused = |why| match why {
        crate::scripts::LayoutRefused::TaskRuns(id) => Error::invalid(format!(
            "task '{id}' runs over {} partitions: wait for it (or cancel it) before changing the count",
            now.count()
        )),
        crate::scripts::LayoutRefused::Changed => Error::invalid(
            "the partition count was changed by another process meanwhile: read it (`shardctl config`) and try again",
        ),
    };
    // refused, it writes nothing: checked first
    crate::scripts::set_layout(con, home, &read, k, &new, &retired, true).await?.map_err(refused)?;
    // the queue's settings reach the new partitions before any task does: paused, its events,
    // its rate limit (split evenly, as `shardctl limit` does)
    let names = ["paused", "events_maxlen", "events_completions", "limit_max", "limit_per_ms"];
    let v: Vec<Option<u64>> = redis::cmd("HMGET").arg(home.meta()).arg(&names).query_async(con).await?;
    for pk in &layout.partitions {
        for (name, value) in names.iter().zip(&v) {
            match (*name, value) {
                (_, None) => {
                    let () = redis::cmd("HDEL").arg(pk.meta()).arg(*name).query_async(con).await?;
                }
                ("limit_max", Some(m)) => {
                    let () =
                        redis::cmd("HSET").arg(pk.meta()).arg(*name).arg(m.div_ceil(k as u64)).query_async(con).await?;
                }
                (_, Some(x)) => {
                    let () = redis::cmd("HSET").arg(pk.meta()).arg(*name).arg(*x).query_async(con).await?;
                }
            }
        }
    }
    crate::scripts::set_layout(con, home, &read, k, &new, &retired, false).await?.map_err(refused)?;
    Ok(layout)
}

/// How often executor nodes and coordinators read the layout, to follow a change.
pub const LAYOUT_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// The tags of partitions 1..=`k`, none of them in `retired` (a retired partition's keys may
/// still be being removed by `clean`: it never comes back into use until they are). `owner`
/// names the master serving a slot (`None`: one server, where each partition takes the smallest
/// salt not retired, 0 at first). On a cluster each partition in turn takes the smallest salt whose
/// slot's master holds the fewest partitions so far, so that partitions land on distinct
/// masters while there are enough; among those, a master other than the home's first (it
/// carries the queue-wide keys, a light load beside a partition's), then the one listed first
/// in `masters`.
pub fn choose_tags(
    prefix: &str,
    queue: &str,
    k: u32,
    masters: &[String],
    retired: &[String],
    owner: impl Fn(u16) -> Option<String>,
) -> Result<Vec<String>> {
    validate_count(k)?;
    if k == 1 {
        return Ok(Vec::new());
    }
    let free = |t: &String| !retired.contains(t);
    let home = owner(key_slot(&format!("{{{prefix}:{queue}}}")));
    let Some(home) = home else {
        return Ok((1..=k)
            .map(|p| (0..).map(|salt| tag(prefix, queue, p, salt)).find(free).expect("a salt not retired"))
            .collect());
    };
    let mut held: BTreeMap<&str, u32> = masters.iter().map(|m| (m.as_str(), 0)).collect();
    let mut out = Vec::new();
    for p in 1..=k {
        let least = masters.iter().map(|m| held[m.as_str()]).min().unwrap_or(0);
        let fewest = || masters.iter().filter(|m| held[m.as_str()] == least);
        let target = fewest().find(|m| **m != home).or_else(|| fewest().next()).cloned();
        let mut chosen = None;
        // each salt lands on a master with probability about 1/masters: a few tries suffice
        for salt in 0..100_000 {
            let t = tag(prefix, queue, p, salt);
            if !free(&t) {
                continue;
            }
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
        assert!(choose_tags("shardctl", "q", 1, &[], &[], |_| None).unwrap().is_empty());
        assert!(validate_count(0).is_err() && validate_count(65).is_err() && validate_count(64).is_ok());
    }

    #[test]
    fn on_one_server_every_salt_is_zero() {
        let tags = choose_tags("shardctl", "q", 3, &[], &[], |_| None).unwrap();
        assert_eq!(tags, ["shardctl:q@1.0", "shardctl:q@2.0", "shardctl:q@3.0"]);
    }

    #[test]
    fn a_retired_tag_is_never_chosen_again() {
        let retired = vec!["shardctl:q@3.0".to_owned(), "shardctl:q@1.0".to_owned(), "shardctl:q@1.1".to_owned()];
        let tags = choose_tags("shardctl", "q", 3, &[], &retired, |_| None).unwrap();
        assert_eq!(tags, ["shardctl:q@1.2", "shardctl:q@2.0", "shardctl:q@3.1"]);
    }

    #[test]
    fn on_a_cluster_partitions_land_on_distinct_masters_the_homes_last() {
        let masters: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let home = thirds(key_slot("{shardctl:q}")).unwrap();
        for k in [2u32, 3, 6] {
            let tags = choose_tags("shardctl", "q", k, &masters, &[], thirds).unwrap();
            assert_eq!(tags.len(), k as usize);
            let owners: Vec<String> = tags.iter().map(|t| thirds(key_slot(&format!("{{{t}}}"))).unwrap()).collect();
            let mut count: BTreeMap<&str, u32> = BTreeMap::new();
            for o in &owners {
                *count.entry(o.as_str()).or_default() += 1;
            }
            // evenly over the masters, the home's master last to take one more
            let held = |m: &str| count.get(m).copied().unwrap_or(0);
            let (lo, hi) =
                (masters.iter().map(|m| held(m)).min().unwrap(), masters.iter().map(|m| held(m)).max().unwrap());
            assert!(hi - lo <= 1, "k={k}: {owners:?} (home on {home})");
            if k == 2 {
                assert!(!owners.contains(&home), "k=2 keeps the home's master free: {owners:?}");
            }
            if k == 3 {
                assert_eq!(count.len(), 3, "k=3: one partition per master: {owners:?}");
            }
            // distinct tags, none a queue name's tag
            assert!(tags.iter().all(|t| t.contains('@')));
        }
    }
}
