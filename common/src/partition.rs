//! Partitions of a queue (ARCHITECTURE.md, "Partitioned queues"): partition p (1 ≤ p ≤ K) of
//! queue Q under prefix P is the keyspace of the hash tag `P:Q@p.s`, `s` a salt chosen once so
//! that the partitions land on distinct masters of a cluster while there are enough. `@` cannot
//! occur in a queue or prefix name, so no partition's tag is another queue's.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use crate::error::{Error, Result, ScriptCode};
use crate::home::Home;
use crate::keys::Keys;
use crate::model::TaskSpec;
use crate::share::{home_inc_of, share_inc};
use crate::slot::key_slot;

/// A queue's keyspaces: its home and, when it is partitioned, partitions 1..=K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The home `{P:Q}`: queue-wide keys and task records.
    pub home: Home,
    /// Partitions 1..=K in order (index p-1); empty for an unpartitioned queue (K = 1).
    pub parts: Vec<Keys>,
}

impl Layout {
    /// K: 1 for an unpartitioned queue.
    pub fn count(&self) -> u32 {
        (self.parts.len() as u32).max(1)
    }

    /// Whether tasks are split over partitions (K ≥ 2).
    pub fn partitioned(&self) -> bool {
        !self.parts.is_empty()
    }

    /// The keys of partition `p` (1-based).
    pub fn part(&self, p: u32) -> Result<&Keys> {
        self.parts
            .get((p as usize).wrapping_sub(1))
            .ok_or_else(|| Error::Protocol(format!("queue {} has no partition {p}", self.home.queue())))
    }

    /// Every keyspace the queue's shards run in: the home alone, or the partitions.
    pub fn shard_spaces(&self) -> &[Keys] {
        if self.parts.is_empty() {
            std::slice::from_ref(&self.home)
        } else {
            &self.parts
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
        (Some(_), None) => Ok(Layout { home: home.clone(), parts: Vec::new() }),
        (None, None) => layout(con, home).await,
    }
}

/// The tags of `layout`'s partitions, space-separated (as stored).
pub fn tags_of(layout: &Layout) -> String {
    layout.parts.iter().map(|p| p.prefix()[1..p.prefix().len() - 2].to_owned()).collect::<Vec<_>>().join(" ")
}

/// The layout stored as `k` and `tags` (space-separated).
fn layout_of(home: &Home, k: u32, tags: &str) -> Result<Layout> {
    if k <= 1 {
        return Ok(Layout { home: home.clone(), parts: Vec::new() });
    }
    let parts = tags.split_whitespace().map(|t| home.partition(t)).collect::<Result<Vec<_>>>()?;
    if parts.len() != k as usize {
        return Err(Error::Protocol(format!("queue {}: {k} partitions but {} tags stored", home.queue(), parts.len())));
    }
    Ok(Layout { home: home.clone(), parts })
}

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

/// Sets the queue's partition count to `k` (1 to [`MAX_PARTITIONS`]) and returns the layout.
/// The tags are chosen from the slot map of the cluster `con` reaches when `on_cluster` (one
/// server: salt 0, and no `CLUSTER` command is sent). Refused while a task dispatched over
/// partitions is unfinished: its shares must be served where they are (`layout.lua`, the only
/// writer of the layout; ARCHITECTURE.md, "Changing the layout"). Setting the count it has
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
    for pk in &layout.parts {
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

/// Runs the failed shards of task `id` over partitions again (`shardctl retry`), ended or still
/// running: the home record is reopened (`reopen.lua`: a new round, the counts of the shares
/// with failures forgotten), then every share not counted is retried in its partition
/// (`retry.lua`) in the new round. A task whose shards all succeeded but whose aggregation
/// failed retries its aggregation alone, in the home. On a running task without failures it
/// completes a retry cut short (see [`resume_retries`]). Returns how many shards (or 1: the
/// aggregation) run again.
pub async fn retry<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<u64> {
    let layout = task_layout(con, home, id).await?;
    if !layout.partitioned() {
        // the home record is its one share: `retry.lua` on it
        return crate::control::retry_here(con, home, id).await;
    }
    let mut fields: Vec<String> = ["state", "round"].map(str::to_owned).to_vec();
    fields.extend((1..=layout.count()).map(|p| format!("part:{p}")));
    let row: Vec<Option<String>> = redis::cmd("HMGET").arg(home.task(id)).arg(&fields).query_async(con).await?;
    let state = row[0].clone();
    let failed_parts: Vec<u32> = (1..=layout.count())
        .filter(|p| {
            row[1 + *p as usize]
                .as_deref()
                .and_then(|v| v.split_once('/'))
                .is_some_and(|(_, f)| f.parse::<u64>().is_ok_and(|f| f > 0))
        })
        .collect();
    match state.as_deref() {
        Some("running") => {
            let round = row[1].as_deref().and_then(|r| r.parse().ok()).unwrap_or(0);
            let counted: Vec<bool> = (1..=layout.count()).map(|p| row[1 + p as usize].is_some()).collect();
            if failed_parts.is_empty() && !uncounted_failures(con, &layout, id, &counted).await? {
                return resume_retries(con, &layout, id, round).await;
            }
            reopen_and_retry(con, &layout, id).await
        }
        Some("completed" | "failed" | "aggregating") if !failed_parts.is_empty() => {
            reopen_and_retry(con, &layout, id).await
        }
        // only the aggregation failed (or nothing did), a cancelled or missing task: as for any task
        _ => crate::control::retry_here(con, home, id).await,
    }
}

/// Whether a share of task `id` not counted in the home yet (`counted[p - 1]` false) has shards
/// failed for good in its partition.
async fn uncounted_failures<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    counted: &[bool],
) -> Result<bool> {
    let inc = home_inc_of(con, &layout.home, id).await?;
    for (pk, counted) in layout.parts.iter().zip(counted) {
        if *counted {
            continue;
        }
        let failed: Option<u64> = redis::cmd("HGET").arg(pk.task(id)).arg("failed").query_async(con).await?;
        if inc.is_some() && share_inc(con, pk, id).await? == inc && failed.is_some_and(|f| f > 0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Retries the failed shards of task `id`: the home is reopened in a new round, the counts of
/// the shares counted with failures forgotten (`reopen.lua` chooses them, atomically with the
/// counts), then every share not counted in the home takes the new round, running its failed
/// shards again (one with none only takes the round: its count, when it ends, is reported in
/// it). Nothing happens when the task is no longer running and no counted share has failures
/// (another retry came first).
async fn reopen_and_retry<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, id: &str) -> Result<u64> {
    let round = crate::scripts::reopen(con, &layout.home, id, None, &[]).await?;
    if round < 0 {
        return Err(crate::control::refused(id, round, "retry"));
    }
    if round == 0 {
        return Ok(0);
    }
    let mut again = 0;
    for (pk, counted) in layout.parts.iter().zip(counted(con, layout, id).await?) {
        if !counted {
            again += retry_share(con, pk, id, round as u64).await?;
        }
    }
    Ok(again)
}

/// Per partition of task `id`'s layout, whether its share is counted in the home (one read).
async fn counted<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, id: &str) -> Result<Vec<bool>> {
    let fields: Vec<String> = (1..=layout.count()).map(|p| format!("part:{p}")).collect();
    let v: Vec<Option<String>> = redis::cmd("HMGET").arg(layout.home.task(id)).arg(&fields).query_async(con).await?;
    Ok(v.iter().map(Option::is_some).collect())
}

/// Retries the share of task `id` in partition `part` in home round `round`.
async fn retry_share<C: ConnectionLike + Send>(con: &mut C, part: &Keys, id: &str, round: u64) -> Result<u64> {
    match crate::control::retry_in_round(con, part, id, Some(round)).await {
        Ok(n) => Ok(n),
        // gone, or cancelled meanwhile: nothing runs again there
        Err(Error::Refused { .. } | Error::NoTask(_)) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Completes a retry cut short after its home record was reopened: every share of task `id`
/// that ended in a round older than the home's `round`, its count missing in the home, is
/// retried in that round. Returns how many shards run again.
pub async fn resume_retries<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    round: u64,
) -> Result<u64> {
    let inc = home_inc_of(con, &layout.home, id).await?;
    let mut again = 0;
    for (pk, counted) in layout.parts.iter().zip(counted(con, layout, id).await?) {
        if counted {
            continue;
        }
        let (state, share_round): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(pk.task(id)).arg("state").arg("round").query_async(con).await?;
        if crate::share::ended(state.as_deref())
            && share_round.is_some_and(|r| r < round)
            && inc.is_some()
            && share_inc(con, pk, id).await? == inc
        {
            again += retry_share(con, pk, id, round).await?;
        }
    }
    Ok(again)
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

/// Creates the shares of home incarnation `inc` under its dispatch lease, held by `token`
/// (the creator's is the home record's nonce; a dispatch run again takes the lease first),
/// renewed before each share and each chunk of keys, then marks the dispatch complete
/// (ARCHITECTURE.md, "One task, one identity across slots"). A lease lapsed or taken by
/// another stops it with an error: whoever took it creates what is missing.
pub async fn create_shares<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    spec: &TaskSpec,
    inc: &str,
    token: &str,
    keys: Option<&[String]>,
) -> Result<()> {
    let (home, k) = (&layout.home, layout.count());
    if !layout.partitioned() {
        return Ok(()); // the home record is its one share
    }
    for (i, pk) in layout.parts.iter().enumerate() {
        renew(con, home, &spec.id, inc, token).await?;
        create_share_keyed(con, home, pk, i as u32 + 1, k, spec, inc, keys, 0, Some(token)).await?;
    }
    use crate::scripts::{Lease, LeaseAsk};
    match crate::scripts::dispatch_lease(con, home, &spec.id, inc, LeaseAsk::Done, token, DISPATCH_LEASE).await? {
        Lease::Granted => Ok(()),
        _ => Err(lease_lost(&spec.id)),
    }
}

use crate::incarnation::DISPATCH_LEASE;

/// Renews the dispatch lease of `id` (incarnation `inc`) for holder `token`; an error when it
/// lapsed, was taken by another, or the home is gone or another incarnation.
async fn renew<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str, inc: &str, token: &str) -> Result<()> {
    use crate::scripts::{Lease, LeaseAsk};
    match crate::scripts::dispatch_lease(con, home, id, inc, LeaseAsk::Renew, token, DISPATCH_LEASE).await? {
        Lease::Granted => Ok(()),
        _ => Err(lease_lost(id)),
    }
}

fn lease_lost(id: &str) -> Error {
    Error::invalid(format!(
        "the dispatch of task '{id}' lost its lease (it stalled past {}s, or the task was removed or dispatched again): \
         what is missing of it is created by the reconciliation",
        DISPATCH_LEASE.as_secs()
    ))
}

/// Creates share `p` of `k` of task `spec` in partition `pk`, for the incarnation `home_inc` of
/// its home record in `home`: nothing for an empty share, nothing when it exists already for
/// that incarnation; a share of another incarnation under this id (an earlier task's whose
/// removal was cut short, or one a failover of the home made a stranger) is removed, then this
/// one is created. A share created after its task was cancelled is cancelled at once.
pub async fn create_share<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    p: u32,
    k: u32,
    spec: &TaskSpec,
    home_inc: &str,
) -> Result<()> {
    create_share_keyed(con, home, pk, p, k, spec, home_inc, None, 0, None).await
}

/// Keys written per round trip when a share's keys are written.
const KEYS_CHUNK: usize = 5_000;

/// [`create_share`] of a task with one routing key per shard (`keys`, the task's): the share's
/// keys are written in its partition, at its own indexes, just before the share is created
/// (never over a share that exists: a resumed dispatch leaves its keys as they are). The id is
/// listed in the partition's `index` and the keys carry `home_inc` (field `inc`) before the
/// first key, so that a crash part-way leaves nothing `drop_orphans` cannot find; the home's
/// dispatch lease is renewed after every chunk.
#[allow(clippy::too_many_arguments)]
pub async fn create_share_keyed<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    p: u32,
    k: u32,
    spec: &TaskSpec,
    home_inc: &str,
    keys: Option<&[String]>,
    round: u64,
    lease: Option<&str>,
) -> Result<()> {
    let (base, size) = share_range(p, k, spec.shards);
    if size == 0 {
        // none here; another incarnation's share under this id goes
        if let Some(t) = share_inc(con, pk, &spec.id).await?.filter(|t| t != home_inc) {
            drop_stranger(con, home, pk, &spec.id, home_inc, &t).await?;
        }
        return Ok(());
    }
    let mut fields = spec.fields();
    for f in fields.iter_mut() {
        if f.0 == "total" {
            f.1 = size.to_string();
        }
    }
    fields.extend([
        ("part", p.to_string()),
        ("base", base.to_string()),
        ("of", spec.shards.to_string()),
        ("home_inc", home_inc.to_owned()),
        // the home's round (a share created again by the reconciliation takes the one it has)
        ("round", round.to_string()),
    ]);
    let mut created = false;
    for _ in 0..3 {
        match share_inc(con, pk, &spec.id).await? {
            Some(t) if t == home_inc => return Ok(()), // ours: a dispatch resumed
            Some(t) => drop_stranger(con, home, pk, &spec.id, home_inc, &t).await?,
            None => {}
        }
        if let Some(keys) = keys {
            let share = &keys[base as usize..(base + size) as usize];
            write_share_keys(con, home, pk, &spec.id, home_inc, share, lease).await?
        } else if spec.has_keys && !share_keys_complete(con, pk, &spec.id, home_inc, size).await? {
            // created again without its keys (the reconciliation): it keeps those its
            // incarnation left complete, never another's or a part
            let () = redis::cmd("DEL").arg(pk.shard_keys(&spec.id)).query_async(con).await?;
        }
        match crate::scripts::dispatch_fields(con, pk, spec, &fields).await {
            Ok(()) => {
                created = true;
                break;
            }
            // created meanwhile (read again), or a record of this id with no `home_inc`
            Err(Error::Script(ScriptCode::TaskExists)) => {
                if share_inc(con, pk, &spec.id).await?.is_none() {
                    crate::scripts::drop_share(con, pk, &spec.id, "", "").await?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    if !created {
        return Err(Error::Protocol(format!("share {p} of task {} could not be created", spec.id)));
    }
    // a cancel of the task that came between its home record and this share misses the share:
    // it is cancelled here
    let state: Option<String> = redis::cmd("HGET").arg(home.task(&spec.id)).arg("state").query_async(con).await?;
    if home_inc_of(con, home, &spec.id).await?.as_deref() != Some(home_inc)
        || matches!(state.as_deref(), Some("cancelled") | None)
    {
        match crate::control::cancel_in(con, pk, &spec.id).await {
            Ok(_) | Err(Error::Refused { .. } | Error::NoTask(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the share of `id` in `pk` that names home incarnation `theirs`, for a creator of
/// incarnation `ours`, only while `ours` is still the home's: the share was read first, then
/// the home (a share of a newer incarnation exists only once its home does), so a creator that
/// stalled while its task was removed and dispatched again stops instead of removing the new
/// task's share (an error: nothing of `ours` is to be created any more).
async fn drop_stranger<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    id: &str,
    ours: &str,
    theirs: &str,
) -> Result<()> {
    if home_inc_of(con, home, id).await?.as_deref() != Some(ours) {
        return Err(Error::invalid(format!("task '{id}' was removed or dispatched again meanwhile")));
    }
    crate::scripts::drop_share(con, pk, id, theirs, "").await?;
    Ok(())
}

/// Writes `share`, the keys of one share of task `id` at its own indexes, for home incarnation
/// `home_inc`: the id listed in the partition's `index` and the keys' `inc` first (what
/// `drop_orphans` finds them by), the keys of an earlier incarnation dropped, then the keys in
/// chunks, renewing the home's dispatch lease after each (an error when the home is gone or
/// another incarnation: the dispatch was cancelled and cleaned, or lost, meanwhile).
async fn write_share_keys<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    id: &str,
    home_inc: &str,
    share: &[String],
    lease: Option<&str>,
) -> Result<()> {
    let kk = pk.shard_keys(id);
    let theirs: Option<String> = redis::cmd("HGET").arg(&kk).arg("inc").query_async(con).await?;
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("ZADD").arg(pk.index()).arg("NX").arg(0).arg(id).ignore();
    if theirs.as_deref() != Some(home_inc) {
        pipe.del(&kk).ignore();
    }
    pipe.hset(&kk, "inc", home_inc).ignore();
    let () = pipe.query_async(con).await?;
    for (c, chunk) in share.chunks(KEYS_CHUNK).enumerate() {
        // the lease first: a writer whose lease lapsed writes no more
        if let Some(token) = lease {
            renew(con, home, id, home_inc, token).await?;
        }
        let pairs: Vec<(usize, &String)> = chunk.iter().enumerate().map(|(j, key)| (c * KEYS_CHUNK + j, key)).collect();
        let () = redis::cmd("HSET").arg(&kk).arg(&pairs).query_async(con).await?;
    }
    Ok(())
}

/// Whether the keys of share `id` in `pk` are complete for home incarnation `home_inc`: its
/// `size` keys and its `inc` (a share lost with its keys kept, created again by the
/// reconciliation, keeps them).
pub async fn share_keys_complete<C: ConnectionLike + Send>(
    con: &mut C,
    pk: &Keys,
    id: &str,
    home_inc: &str,
    size: u64,
) -> Result<bool> {
    let kk = pk.shard_keys(id);
    let (inc, n): (Option<String>, u64) = redis::pipe().hget(&kk, "inc").hlen(&kk).query_async(con).await?;
    Ok(inc.as_deref() == Some(home_inc) && n == size + 1)
}

/// The spec a home record was dispatched with (what its shares are made of).
pub fn spec_of(t: &crate::model::TaskInfo, priority: i64) -> TaskSpec {
    let mut spec = TaskSpec::new(t.task_id.clone(), t.kind.clone(), t.total);
    spec.items = t.items;
    spec.payload = t.payload.clone();
    spec.attempts = t.attempts;
    spec.backoff = t.backoff.parse().unwrap_or_default();
    spec.priority = priority;
    spec.shard_timeout = (t.shard_timeout_ms > 0).then(|| std::time::Duration::from_millis(t.shard_timeout_ms));
    spec.keep_results = t.keep_results;
    spec.retain = (t.retain_ms > 0).then(|| std::time::Duration::from_millis(t.retain_ms));
    spec.strategy = t.strategy.parse().unwrap_or_default();
    spec.vnodes = t.vnodes;
    spec.has_keys = t.has_keys;
    spec
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
    for pk in layout.parts.iter().chain(&retired) {
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
        let kinds: Vec<String> = redis::cmd("SMEMBERS").arg(pk.kinds()).query_async(con).await?;
        for k in &kinds {
            pipe.del(&[pk.lane_wait(k), pk.lane_tasks(k), pk.lane_marker(k)]).ignore();
        }
        for key in [
            pk.kinds(),
            pk.any_kind_marker(),
            pk.meta(),
            pk.events(),
            pk.leases(),
            pk.marker(),
            pk.active(),
            pk.stalled(),
            pk.stalled_check(),
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
        crate::scripts::unretire(con, &layout.home, &pk.prefix()[1..pk.prefix().len() - 2]).await?;
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
