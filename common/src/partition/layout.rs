//! A queue's [`Layout`]: its home and partitions 1..=K, as stored in its `meta`, each task's own
//! layout, the shard range of each share, and the tags that name partitions.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::home::Home;
use crate::keys::Keys;

/// A queue's keyspaces: its home and, when it is partitioned, partitions 1..=K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The home `{P:Q}`: queue-wide keys and task records.
    pub home: Home,
    /// Partitions 1..=K in order (index p-1); empty for an unpartitioned queue (K = 1).
    pub partitions: Vec<Keys>,
}

impl Layout {
    /// K: 1 for an unpartitioned queue.
    pub fn count(&self) -> u32 {
        (self.partitions.len() as u32).max(1)
    }

    /// Whether tasks are split over partitions (K ≥ 2).
    pub fn partitioned(&self) -> bool {
        !self.partitions.is_empty()
    }

    /// The keys of partition `p` (1-based).
    pub fn partition(&self, p: u32) -> Result<&Keys> {
        self.partitions
            .get((p as usize).wrapping_sub(1))
            .ok_or_else(|| Error::Protocol(format!("queue {} has no partition {p}", self.home.queue())))
    }

    /// Every keyspace the queue's shards run in: the home alone, or the partitions.
    pub fn shard_spaces(&self) -> &[Keys] {
        if self.partitions.is_empty() {
            std::slice::from_ref(&self.home)
        } else {
            &self.partitions
        }
    }
}

/// Partition `p`'s share (1 ≤ p ≤ k) of a task of `n` shards: its first index and its size.
/// Shard i belongs to partition `1 + ⌊i·k / n⌋`: contiguous ranges, sizes within one.
pub fn share_range(p: u32, k: u32, n: u64) -> (u64, u64) {
    let start = |p: u32| (((p as u128 - 1) * n as u128).div_ceil(k as u128)) as u64;
    let (a, b) = (start(p), start(p + 1));
    (a, b - a)
}

/// Reads the layout of `home`'s queue from its `meta` (`partitions`, `partition_tags`).
pub async fn layout<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Layout> {
    let (k, tags): (Option<u32>, Option<String>) =
        redis::cmd("HMGET").arg(home.meta()).arg("partitions").arg("partition_tags").query_async(con).await?;
    layout_of(home, k.unwrap_or(1), tags.as_deref().unwrap_or(""))
}

/// The partitions task `id` was dispatched over (its home record keeps their tags: a later
/// change of the queue's count leaves its shares where they are); the home alone for a task
/// dispatched over one partition, the queue's current layout when there is no such task.
pub async fn task_layout<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<Layout> {
    let (state, tags): (Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(home.task(id)).arg("state").arg("partition_tags").query_async(con).await?;
    match (state, tags) {
        (_, Some(t)) => layout_of(home, t.split_whitespace().count() as u32, &t),
        (Some(_), None) => Ok(Layout { home: home.clone(), partitions: Vec::new() }),
        (None, None) => layout(con, home).await,
    }
}

/// The tags of `layout`'s partitions, space-separated (as stored).
pub fn tags_of(layout: &Layout) -> String {
    layout.partitions.iter().map(|p| p.tag().to_owned()).collect::<Vec<_>>().join(" ")
}

/// The layout stored as `k` and `tags` (space-separated).
pub(super) fn layout_of(home: &Home, k: u32, tags: &str) -> Result<Layout> {
    if k <= 1 {
        return Ok(Layout { home: home.clone(), partitions: Vec::new() });
    }
    let partitions = tags.split_whitespace().map(|t| home.partition(t)).collect::<Result<Vec<_>>>()?;
    if partitions.len() != k as usize {
        return Err(Error::Protocol(format!(
            "queue {}: {k} partitions but {} tags stored",
            home.queue(),
            partitions.len()
        )));
    }
    Ok(Layout { home: home.clone(), partitions })
}

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

/// Shares looked at per round trip of [`drop_orphans`].
const ORPHAN_BATCH: isize = 1000;

/// Removes the shares whose home record is gone (cleaned, or expired with its retention) or is
/// another incarnation, in every partition: the whole `index`, 1,000 shares per three round
/// trips, each removal guarded in its slot (`drop_share.lua`: only if the share was not
/// dispatched again meanwhile). Returns how many were removed.
pub async fn drop_orphans<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<u64> {
    let mut removed = 0;
    // and the partitions a change of the count retired: emptied, their keys go
    let retired: Option<String> =
        redis::cmd("HGET").arg(layout.home.meta()).arg("retired_tags").query_async(con).await?;
    let retired: Vec<Keys> =
        retired.unwrap_or_default().split_whitespace().filter_map(|t| layout.home.partition(t).ok()).collect();
    for pk in layout.partitions.iter().chain(&retired) {
        let mut from: isize = 0;
        loop {
            let ids: Vec<String> =
                redis::cmd("ZRANGE").arg(pk.index()).arg(from).arg(from + ORPHAN_BATCH - 1).query_async(con).await?;
            if ids.is_empty() {
                break;
            }
            let mut theirs = redis::pipe();
            let mut homes = redis::pipe();
            for id in &ids {
                theirs.hget(pk.task(id), "home_inc").hget(pk.task(id), "home_seq").hget(pk.shard_keys(id), "inc");
                homes.hget(layout.home.task(id), "inc").hget(layout.home.task(id), "seq");
            }
            let theirs: Vec<Option<String>> = theirs.query_async(con).await?;
            let homes: Vec<Option<String>> = homes.query_async(con).await?;
            let mut here = 0;
            for (i, id) in ids.iter().enumerate() {
                let or = |a: &Option<String>, b: &Option<String>| a.clone().or_else(|| b.clone());
                let share = or(&theirs[3 * i], &theirs[3 * i + 1]);
                let home = or(&homes[2 * i], &homes[2 * i + 1]);
                // a share (or, with no share, its keys: a dispatch that died before it) of the
                // home's own incarnation stays; any other is an orphan
                let keys = theirs[3 * i + 2].clone();
                let of_home = match &share {
                    Some(_) => share == home,
                    None => keys.is_some() && keys == home,
                };
                if home.is_some() && of_home {
                    continue;
                }
                let (s, k) = (share.as_deref().unwrap_or(""), keys.as_deref().unwrap_or(""));
                if crate::scripts::drop_share(con, pk, id, s, if s.is_empty() { k } else { "" }).await? {
                    here += 1;
                }
            }
            removed += here as u64;
            // the removed entries left the index: the next page starts that much earlier
            from += ORPHAN_BATCH - here;
        }
    }
    for pk in &retired {
        let left: u64 = redis::cmd("ZCARD").arg(pk.index()).query_async(con).await?;
        if left > 0 {
            continue;
        }
        let mut pipe = redis::pipe();
        let (kinds, nodes): (Vec<String>, Vec<String>) =
            redis::pipe().smembers(pk.kinds()).smembers(pk.routed_nodes()).query_async(con).await?;
        for k in &kinds {
            pipe.del(&[pk.lane_wait(k), pk.lane_tasks(k), pk.lane_marker(k)]).ignore();
        }
        // routed tasks left a list and a marker per node (a cancelled one, its waiting refs)
        for n in &nodes {
            pipe.del(&[pk.node_wait(n), pk.node_marker(n)]).ignore();
        }
        for key in [
            pk.routed_nodes(),
            pk.reroute(),
            pk.unrouted(),
            pk.rebalance_lock(),
            pk.rebalancing(),
            pk.legacy_wait(),
            pk.legacy_tasks(),
            pk.kinds(),
            pk.any_kind_marker(),
            pk.meta(),
            pk.events(),
            pk.leases(),
            pk.marker(),
            pk.active(),
            pk.held(),
            pk.stalled(),
            pk.stalled_check(),
            pk.speculating(),
            pk.backups(),
            pk.limiter(),
            pk.delayed(),
            pk.unreported(),
            pk.running(),
            pk.finished(),
            pk.expiring(),
            pk.scheduled(),
        ] {
            pipe.del(key).ignore();
        }
        let () = pipe.query_async(con).await?;
        crate::scripts::unretire(con, &layout.home, pk.tag()).await?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_task_once_in_order() {
        for (k, n) in [(2u32, 1u64), (3, 2), (3, 3), (3, 10), (7, 1_000_003), (64, 4_294_967_296), (2, 4_294_967_296)] {
            let mut next = 0;
            for p in 1..=k {
                let (base, size) = share_range(p, k, n);
                assert_eq!(base, next, "k {k} n {n} p {p}");
                for i in [base, base + size.saturating_sub(1)] {
                    if size > 0 {
                        assert_eq!(1 + (i as u128 * k as u128 / n as u128) as u32, p, "shard {i} of {n} over {k}");
                    }
                }
                next = base + size;
            }
            assert_eq!(next, n);
        }
    }
}
