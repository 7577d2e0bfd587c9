//! A task's shares, the one layer that knows them (docs/design/partitions.md). Every task is a home
//! record and its shares: over one partition the home
//! record is its one share (base 0, the whole task), over K ≥ 2 each partition holds one.
//! Readers and controls ask this layer for a task's shares ([`of`]) and read each the same way;
//! none of them branches on the partition count.
//!
//! The share-reading rule, once: a record in a partition is task `id`'s share only if it names
//! its home's incarnation id (`home_inc` equal to the home's `inc`); anything else under the id
//! (an earlier task's share, or one a failover of the home made a stranger) is not read as the
//! task's by any reader (progress, reasons, the shard map, the aggregation, the reconciliation,
//! retry).

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::home::Home;
use crate::keys::Keys;
use crate::model::TaskInfo;

/// One share of a task: where its shards run, and which of the task's shards it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareAt {
    /// The keyspace its record and shards are in (the home itself for a task of one partition).
    pub keys: Keys,
    /// Its partition, 1..=K; 0 for the home record holding the whole task itself.
    pub partition: u32,
    /// The task's index of its shard 0.
    pub base: u64,
    /// How many shards it holds.
    pub size: u64,
}

impl ShareAt {
    /// Whether this share is the home record itself (a task of one partition).
    pub fn is_home(&self) -> bool {
        self.partition == 0
    }
}

/// What a task record says of its place among its task's shares (the one reading of
/// [`crate::model::TaskInfo::share`]).
impl TaskInfo {
    /// The task's index of this record's shard `index` (the same unless it is a share).
    pub fn global_index(&self, index: u64) -> u64 {
        self.share.as_ref().map_or(index, |s| s.base + index)
    }

    /// The task's shard count (a share's own `total` is its size).
    pub fn task_total(&self) -> u64 {
        self.share.as_ref().map_or(self.total, |s| s.of)
    }

    /// The partition this record is a share in; `None` for a home record.
    pub fn partition(&self) -> Option<u32> {
        self.share.as_ref().map(|s| s.partition)
    }

    /// "spread over K partitions" for a home record over K ≥ 2 partitions, for `status`.
    pub fn spread(&self) -> Option<String> {
        (self.partitions > 1).then(|| format!("spread over {} partitions", self.partitions))
    }
}

/// The shares of task `t` (its home record in `home`), in the task's index order: the home
/// record alone over one partition (no read), else each non-empty share in the partitions the
/// task was dispatched over (one read of its home record).
pub async fn of<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Vec<ShareAt>> {
    if t.partitions <= 1 {
        return Ok(vec![ShareAt { keys: home.keys().clone(), partition: 0, base: 0, size: t.total }]);
    }
    let layout = crate::partition::layout::task_layout(con, home, &t.task_id).await?;
    let k = layout.count();
    Ok(layout
        .partitions
        .into_iter()
        .enumerate()
        .map(|(i, keys)| {
            let partition = i as u32 + 1;
            let (base, size) = crate::partition::layout::share_range(partition, k, t.total);
            ShareAt { keys, partition, base, size }
        })
        .filter(|s| s.size > 0)
        .collect())
}

/// The record of share `s` of task `t` as a task (its state, counts and cursor in its own
/// keyspace), `None` when it is missing or another incarnation's. The home record is its own
/// share: `t` itself, no read.
pub async fn record<C: ConnectionLike + Send>(con: &mut C, s: &ShareAt, t: &TaskInfo) -> Result<Option<TaskInfo>> {
    if s.is_home() {
        return Ok(Some(t.clone()));
    }
    let h: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(s.keys.task(&t.task_id)).query_async(con).await?;
    Ok(TaskInfo::from_hash(&t.task_id, &h)?.filter(|r| r.share.as_ref().is_some_and(|x| x.home_inc == t.inc)))
}

/// The sums over the shares of task `t` of what they count as they run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    /// Shards completed.
    pub done: u64,
    /// Shards failed for good.
    pub failed: u64,
    /// Shards handed out from the cursors.
    pub cursor: u64,
    /// Shards placed on nodes (routed tasks).
    pub routed: u64,
    /// Backup attempts started for stragglers (`--speculate`, docs/design/speculation.md).
    pub spec_started: u64,
    /// Backup attempts that finished first.
    pub spec_won: u64,
}

/// The sums of [`Sums`] over the shares of task `t`: one read per partition; the home record's
/// own counts, no read, over one partition.
pub async fn sums<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Sums> {
    let mut sum = Sums::default();
    for s in of(con, home, t).await? {
        if s.is_home() {
            let routed = t.routed.unwrap_or(0);
            let (spec_started, spec_won) = (t.spec_started, t.spec_won);
            sum = Sums { done: t.done, failed: t.failed, cursor: t.cursor, routed, spec_started, spec_won };
            continue;
        }
        let fields = ["done", "failed", "cursor", "routed", "spec_started", "spec_won"];
        if let Some(v) = read(con, &s.keys, &t.task_id, &t.inc, &fields).await? {
            sum.done += num(&v[0]);
            sum.failed += num(&v[1]);
            sum.cursor += num(&v[2]);
            sum.routed += num(&v[3]);
            sum.spec_started += num(&v[4]);
            sum.spec_won += num(&v[5]);
        }
    }
    Ok(sum)
}

/// The run times and the completions over time of task `t` over its shares
/// (docs/design/dashboard.md, "Where time goes"): one read per partition; the home record's own
/// over one.
pub async fn timing<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    t: &TaskInfo,
) -> Result<(crate::durations::Histogram, Option<crate::throughput::Series>)> {
    let (timed, series) = (crate::durations::fields(), crate::throughput::fields());
    let fields: Vec<&str> = timed.iter().chain(&series).map(String::as_str).collect();
    let (mut histogram, mut throughput) = (crate::durations::Histogram::default(), None::<crate::throughput::Series>);
    for s in of(con, home, t).await? {
        if s.is_home() {
            return Ok((t.histogram.clone(), t.throughput.clone()));
        }
        if let Some(v) = read(con, &s.keys, &t.task_id, &t.inc, &fields).await? {
            let (h, tp) = v.split_at(timed.len());
            histogram.add(&crate::durations::Histogram::from_values(h));
            if let Some(s) = crate::throughput::Series::from_values(tp) {
                throughput = Some(if let Some(before) = throughput { before.merged(&s) } else { s });
            }
        }
    }
    Ok((histogram, throughput))
}

/// Shards of task `t` held now over its shares (running, or claimed to start next): each
/// keyspace's count in `held` (docs/design/fairness.md); and of its group, when it has one.
pub async fn held<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<(u64, Option<u64>)> {
    let (mut task, mut group) = (0, t.group.as_ref().map(|_| 0));
    for s in of(con, home, t).await? {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(s.keys.held()).arg(&t.task_id);
        if let Some(g) = &t.group {
            cmd.arg(format!("g:{g}"));
        }
        let v: Vec<Option<u64>> = cmd.query_async(con).await?;
        task += v.first().copied().flatten().unwrap_or(0);
        if let Some(n) = group.as_mut() {
            *n += v.get(1).copied().flatten().unwrap_or(0);
        }
    }
    Ok((task, group))
}

/// The reasons of task `t`'s shards failed for good, at the task's shard indexes, in index order
/// (each share's reasons at its base); a shard that failed an attempt and still retries is not
/// among them.
pub async fn reasons<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Vec<(u64, String)>> {
    let mut v: Vec<(u64, String)> = Vec::new();
    for s in of(con, home, t).await? {
        if !s.is_home() && read(con, &s.keys, &t.task_id, &t.inc, &[]).await?.is_none() {
            continue;
        }
        let h: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(s.keys.errors(&t.task_id)).query_async(con).await?;
        let mine: Vec<(u64, String)> =
            h.into_iter().filter_map(|(k, r)| k.parse::<u64>().ok().filter(|&i| i < s.size).map(|i| (i, r))).collect();
        // a reason without the terminal bit is a shard's that still retries (or was stopped): not
        // a failure (yet)
        let mut pipe = redis::pipe();
        for (i, _) in &mine {
            pipe.cmd("GETBIT").arg(s.keys.terminal(&t.task_id)).arg(i);
        }
        let bits: Vec<u8> = if mine.is_empty() { Vec::new() } else { pipe.query_async(con).await? };
        v.extend(mine.into_iter().zip(bits).filter(|(_, b)| *b == 1).map(|((i, r), _)| (s.base + i, r)));
    }
    v.sort();
    Ok(v)
}

/// The `inc` of a home record (its `seq` for one written before incarnations had a nonce),
/// `None` when it is gone.
pub async fn home_inc_of<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<Option<String>> {
    let (inc, seq): (Option<String>, Option<u64>) =
        redis::cmd("HMGET").arg(home.task(id)).arg("inc").arg("seq").query_async(con).await?;
    Ok(crate::incarnation::of_fields(inc.as_deref(), seq))
}

/// The `home_inc` of the share of `id` in `pk` (its `home_seq` for a share written before
/// incarnations had a nonce), `None` when there is no share.
pub async fn share_inc<C: ConnectionLike + Send>(con: &mut C, pk: &Keys, id: &str) -> Result<Option<String>> {
    let (inc, seq): (Option<String>, Option<u64>) =
        redis::cmd("HMGET").arg(pk.task(id)).arg("home_inc").arg("home_seq").query_async(con).await?;
    Ok(crate::incarnation::of_fields(inc.as_deref(), seq))
}

/// Fields `fields` of the share of `id` in `pk`, in one read, if it is the share of home
/// incarnation `inc`; `None` when there is none or it is another incarnation's.
pub async fn read<C: ConnectionLike + Send>(
    con: &mut C,
    pk: &Keys,
    id: &str,
    inc: &str,
    fields: &[&str],
) -> Result<Option<Vec<Option<String>>>> {
    let mut v: Vec<Option<String>> =
        redis::cmd("HMGET").arg(pk.task(id)).arg("home_inc").arg("home_seq").arg(fields).query_async(con).await?;
    let theirs = v[0].clone().or_else(|| v[1].clone());
    if theirs.as_deref() != Some(inc) {
        return Ok(None);
    }
    Ok(Some(v.split_off(2)))
}

/// A field of a share as read by [`read`], as a number (0 when absent or not a number).
pub fn num(v: &Option<String>) -> u64 {
    v.as_deref().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Whether a share in `state` has ended: every shard terminal, waiting for its home
/// (`aggregating`), or ended as its home did (`completed`, `failed`: `end_share.lua`).
pub fn ended(state: Option<&str>) -> bool {
    matches!(state, Some("aggregating" | "completed" | "failed"))
}

/// What the aggregation finds of a share it is about to read ([`check_counted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// Ended with the counts its home counted: its results are the task's.
    Sound,
    /// Counted in the home, but its partition lost writes since (a failover of its master): it
    /// is gone, runs again, or ended with other counts. Its count must be forgotten
    /// (`uncount.lua`) and the task run until it is counted anew.
    Lost(&'static str),
    /// Ended with every count, but not every shard terminal: a state no failover produces (a
    /// partition's writes replicate in order); the aggregation fails with the reason.
    Incomplete(String),
    /// Cancelled: the task was cancelled, and its home lost the cancel since (a failover of the
    /// home's master after it counted every share). The aggregation cancels the task again.
    Cancelled,
}

/// Checks share `s` of task `t` (home `home`) before the aggregation reads its results: this
/// incarnation's, ended, every bit of it terminal, its counts the ones counted. The home record
/// holding the whole task is sound by construction (its counts are its bits, in one slot).
pub async fn check_counted<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    t: &TaskInfo,
    s: &ShareAt,
) -> Result<Counted> {
    if s.is_home() {
        return Ok(Counted::Sound);
    }
    let row =
        read(con, &s.keys, &t.task_id, &t.inc, &["total", "state", "done", "failed", "results_dropped", "cancelled"])
            .await?;
    let bits: u64 = redis::cmd("BITCOUNT").arg(s.keys.terminal(&t.task_id)).query_async(con).await?;
    // (another slot: a command of its own)
    let counted_home: Option<String> =
        redis::cmd("HGET").arg(home.task(&t.task_id)).arg(format!("part:{}", s.partition)).query_async(con).await?;
    let Some(v) = row else { return Ok(Counted::Lost("is gone")) };
    let (total, state) = (v[0].as_deref().and_then(|t| t.parse::<u64>().ok()), v[1].as_deref());
    if matches!(state, Some("running" | "delayed")) {
        return Ok(Counted::Lost("runs again"));
    }
    if state == Some("cancelled") {
        return Ok(Counted::Cancelled);
    }
    // (a share's round may be older than the home's: a retry reruns only the shares with
    // failures; the counts tell a retry lost after its count)
    let ended = ended(state);
    // a share settled as its home ordered counts its unended shards as cancelled
    // (docs/design/failure-policies.md, Over partitions): they have no terminal bit
    let cancelled = num(&v[5]);
    let count = match cancelled {
        0 => format!("{}/{}", num(&v[2]), num(&v[3])),
        c => format!("{}/{}/{c}", num(&v[2]), num(&v[3])),
    };
    if ended && counted_home.as_deref() != Some(count.as_str()) {
        return Ok(Counted::Lost("ended with other counts than its count"));
    }
    if v[4].is_some() {
        // ended as its home, its results dropped (--keep-results false): its home's end was lost
        // since (a failover of the home's master); aggregating again would read no result
        return Ok(Counted::Incomplete("its results were dropped when the task ended".to_owned()));
    }
    if !ended || total != Some(bits + cancelled) {
        return Ok(Counted::Incomplete(format!(
            "{bits} of {} shards terminal, {}",
            total.unwrap_or(0),
            state.unwrap_or_default()
        )));
    }
    Ok(Counted::Sound)
}

/// One ended shard's outcome as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Completed, with this result (JSON text); `None`: none is stored (a `null` result is not,
    /// nor any once a task dispatched with `keep_results` false ended).
    Result(Option<String>),
    /// Failed for good, for this reason.
    Error(String),
}

/// The outcomes of task `t`'s ended shards among `from..from + count` (task indexes, over its
/// shares), in index order; shards not ended are left out. Three reads per share the page
/// touches (its terminal bits, results, reasons).
pub async fn outcomes<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    t: &TaskInfo,
    from: u64,
    count: u64,
) -> Result<Vec<(u64, Stored)>> {
    let to = from.saturating_add(count).min(t.total);
    let mut out = Vec::new();
    for s in of(con, home, t).await? {
        let (lo, hi) = (from.max(s.base) - s.base, to.min(s.base + s.size).saturating_sub(s.base));
        if lo >= hi {
            continue;
        }
        // a leftover of another incarnation under the id is not this task's
        if !s.is_home() && read(con, &s.keys, &t.task_id, &t.inc, &[]).await?.is_none() {
            continue;
        }
        let fields: Vec<u64> = (lo..hi).collect();
        let (bits, results, errors): (Vec<u8>, Vec<Option<String>>, Vec<Option<String>>) = redis::pipe()
            .cmd("GETRANGE")
            .arg(s.keys.terminal(&t.task_id))
            .arg(lo / 8)
            .arg((hi - 1) / 8)
            .cmd("HMGET")
            .arg(s.keys.results(&t.task_id))
            .arg(&fields)
            .cmd("HMGET")
            .arg(s.keys.errors(&t.task_id))
            .arg(&fields)
            .query_async(con)
            .await?;
        let ended = |i: u64| {
            let byte = bits.get(((i - lo / 8 * 8) / 8) as usize).copied().unwrap_or(0);
            byte & (0x80 >> (i % 8)) != 0
        };
        for ((&i, r), e) in fields.iter().zip(results).zip(errors) {
            // a shard not ended has no outcome, whatever reason an attempt of it left
            if !ended(i) {
                continue;
            }
            let stored = match (r, e) {
                (_, Some(e)) => Stored::Error(e),
                (r, None) => Stored::Result(r),
            };
            out.push((s.base + i, stored));
        }
    }
    Ok(out)
}

/// A share's `<index> <line>` (its `first_failure`, `halt_asked`) at the task's index: its
/// `base` added to the leading share index (left as it is when it has none).
pub fn at_task_index(base: u64, v: &str) -> String {
    match v.split_once(' ').map(|(i, rest)| (i.parse::<u64>(), rest)) {
        Some((Ok(i), rest)) => format!("{} {rest}", base + i),
        _ => v.to_owned(),
    }
}
