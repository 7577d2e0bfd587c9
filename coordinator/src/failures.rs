//! A task's failures grouped by cause, for the dashboard (docs/design/dashboard.md, "Failures
//! grouped by cause"): each reason's summary with numbers and ids folded
//! (`shardctl_common::reason::shape`) is one group, with its count, an example, its first and last
//! failure time, the nodes it failed on and the attempts, and its shards. The time, attempt and
//! node come from each shard's `<i>:failure` field (`lua/fail.lua`, `lua/sweep.lua`). At most
//! [`MAX_GROUPED`] reasons are read, share by share over partitions, at the task's indexes.

use std::collections::{BTreeMap, HashMap};

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::TaskInfo;
use shardctl_common::reason::{shape, summary};
use shardctl_common::{Home, Result};

use crate::inspect::{space_reasons, ShardReason};

/// The most reasons one reading groups.
pub const MAX_GROUPED: u64 = 10_000;
/// Shards listed per group, lowest indexes first.
pub const MAX_LISTED: usize = 200;
/// Nodes named per group, most failures first.
const MAX_NODES: usize = 10;
/// Reasons read per `HSCAN` page, and failure fields per `HMGET`.
const PAGE: u64 = 1_000;

/// One failed (or retrying) shard of a group.
#[derive(Debug, Clone, Serialize)]
pub struct FailedShard {
    /// Its index in the task.
    pub shard: u64,
    /// `failed`, `retrying` or `cancelled` (as `GET /api/tasks/ID/failed`).
    pub state: &'static str,
    /// When its last failure was recorded (ms, Redis's clock), if it was.
    pub at_ms: Option<u64>,
    /// The attempt that failed.
    pub attempt: Option<u64>,
    /// The node it failed on (`?`: failed as stalled, its node not known).
    pub node: Option<String>,
    /// Its reason's summary (a traceback's message and innermost frame).
    pub summary: String,
}

/// Failures of one cause.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// The cause: the summary's shape (numbers `N`, ids `ID`).
    pub cause: String,
    /// The summary of its lowest shard.
    pub example: String,
    /// Shards in it.
    pub count: u64,
    /// Of which failed for good.
    pub failed: u64,
    /// Of which will run again.
    pub retrying: u64,
    /// Of which were to run again when their task was cancelled.
    pub cancelled: u64,
    /// Its first failure time (ms), of the shards whose time was recorded.
    pub first_ms: Option<u64>,
    /// Its last failure time (ms).
    pub last_ms: Option<u64>,
    /// `[node, failures]`, most first, at most 10.
    pub nodes: Vec<(String, u64)>,
    /// `[attempt, failures]`, by attempt.
    pub attempts: Vec<(u64, u64)>,
    /// Its shards, lowest indexes first, at most [`MAX_LISTED`].
    pub shards: Vec<FailedShard>,
}

/// A task's failure groups, the largest first.
#[derive(Debug, Clone, Serialize)]
pub struct Groups {
    /// The groups.
    pub groups: Vec<Group>,
    /// Reasons read.
    pub read: u64,
    /// False when the task has more than [`MAX_GROUPED`] reasons: the groups are of those read.
    pub complete: bool,
}

/// Groups the failures of task `t` (its home record in `home`).
pub async fn groups<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Groups> {
    let mut shards: Vec<(ShardReason, Option<String>)> = Vec::new();
    let mut complete = true;
    let all = shardctl_common::share::of(con, home, t).await?;
    let last = all.len().saturating_sub(1);
    'shares: for (n, s) in all.into_iter().enumerate() {
        // a share of another incarnation under the id (a leftover) has nothing of this task
        if !s.is_home() && shardctl_common::share::read(con, &s.keys, &t.task_id, &t.inc, &[]).await?.is_none() {
            continue;
        }
        let mut cursor = 0;
        loop {
            let page = space_reasons(con, &s.keys, t, cursor, PAGE, s.base).await?;
            let context = failure_fields(con, &s.keys.shards(&t.task_id), &page.shards, s.base).await?;
            shards.extend(page.shards.into_iter().zip(context));
            if shards.len() as u64 >= MAX_GROUPED {
                // (complete only when nothing is left: neither in this share nor in a later one)
                complete = page.next_cursor.is_none() && shards.len() as u64 == MAX_GROUPED && n == last;
                shards.truncate(MAX_GROUPED as usize);
                break 'shares;
            }
            match page.next_cursor.and_then(|c| c.parse().ok()) {
                Some(c) => cursor = c,
                None => break,
            }
        }
    }
    // an HSCAN may return a field twice: each shard once
    shards.sort_by_key(|(r, _)| r.shard);
    shards.dedup_by_key(|(r, _)| r.shard);
    let read = shards.len() as u64;
    Ok(Groups { groups: group(shards), read, complete })
}

/// The `<i>:failure` fields (`<ms> <attempt> <node>`) of `reasons`' shards (at the task's
/// indexes, `base` + i) in the shards hash `key`.
async fn failure_fields<C: ConnectionLike + Send>(
    con: &mut C,
    key: &str,
    reasons: &[ShardReason],
    base: u64,
) -> Result<Vec<Option<String>>> {
    let mut out = Vec::with_capacity(reasons.len());
    for chunk in reasons.chunks(PAGE as usize) {
        let fields: Vec<String> = chunk.iter().map(|r| format!("{}:failure", r.shard - base)).collect();
        let got: Vec<Option<String>> = redis::cmd("HMGET").arg(key).arg(&fields).query_async(con).await?;
        out.extend(got);
    }
    Ok(out)
}

/// The groups of `shards` (each with its `<i>:failure` field), largest first, then by lowest
/// shard.
fn group(shards: Vec<(ShardReason, Option<String>)>) -> Vec<Group> {
    let mut by_cause: HashMap<String, Group> = HashMap::new();
    let mut nodes: HashMap<String, HashMap<String, u64>> = HashMap::new();
    let mut attempts: HashMap<String, BTreeMap<u64, u64>> = HashMap::new();
    let mut sorted = shards;
    sorted.sort_by_key(|(r, _)| r.shard);
    for (r, field) in sorted {
        let s = summary(&r.reason);
        let cause = shape(&s);
        let (at_ms, attempt, node) = parse(field.as_deref());
        let g = by_cause.entry(cause.clone()).or_insert_with(|| Group {
            cause: cause.clone(),
            example: s.clone(),
            count: 0,
            failed: 0,
            retrying: 0,
            cancelled: 0,
            first_ms: None,
            last_ms: None,
            nodes: Vec::new(),
            attempts: Vec::new(),
            shards: Vec::new(),
        });
        g.count += 1;
        match r.state {
            "failed" => g.failed += 1,
            "retrying" => g.retrying += 1,
            _ => g.cancelled += 1,
        }
        if let Some(ms) = at_ms {
            g.first_ms = Some(g.first_ms.map_or(ms, |f| f.min(ms)));
            g.last_ms = Some(g.last_ms.map_or(ms, |l| l.max(ms)));
        }
        if let Some(n) = &node {
            *nodes.entry(cause.clone()).or_default().entry(n.clone()).or_default() += 1;
        }
        if let Some(a) = attempt {
            *attempts.entry(cause.clone()).or_default().entry(a).or_default() += 1;
        }
        if g.shards.len() < MAX_LISTED {
            g.shards.push(FailedShard { shard: r.shard, state: r.state, at_ms, attempt, node, summary: s });
        }
    }
    let mut out: Vec<Group> = by_cause
        .into_values()
        .map(|mut g| {
            let mut n: Vec<(String, u64)> = nodes.remove(&g.cause).unwrap_or_default().into_iter().collect();
            n.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            n.truncate(MAX_NODES);
            g.nodes = n;
            g.attempts = attempts.remove(&g.cause).unwrap_or_default().into_iter().collect();
            g
        })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.shards[0].shard.cmp(&b.shards[0].shard)));
    out
}

/// `<ms> <attempt> <node>` as its parts (each `None` when absent or malformed).
fn parse(field: Option<&str>) -> (Option<u64>, Option<u64>, Option<String>) {
    let Some(f) = field else { return (None, None, None) };
    let mut parts = f.splitn(3, ' ');
    let ms = parts.next().and_then(|p| p.parse().ok());
    let attempt = parts.next().and_then(|p| p.parse().ok());
    let node = parts.next().filter(|n| !n.is_empty()).map(str::to_owned);
    (ms, attempt, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(shard: u64, state: &'static str, reason: &str) -> ShardReason {
        ShardReason { shard, reason: reason.to_owned(), state }
    }

    #[test]
    fn sixty_failures_of_one_cause_are_one_group_with_their_nodes_and_times() {
        let mut shards: Vec<(ShardReason, Option<String>)> = (0..60)
            .map(|i| {
                let why = format!("Traceback (most recent call last):\n  File \"/app/w.py\", line 9, in handle\nValueError: bad row {}", i * 7);
                let node = if i % 3 == 0 { "n1" } else { "n2" };
                (reason(i, "failed", &why), Some(format!("{} {} {node}", 1_000 + i, 1 + i % 2)))
            })
            .collect();
        shards.push((reason(99, "retrying", "timeout after 30s"), Some("5 1 ?".into())));
        shards.push((reason(98, "failed", "timeout after 31s"), None));
        let g = group(shards);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].count, g[0].failed, g[0].example.as_str()),
            (60, 60, "ValueError: bad row 0 (at w.py:9 in handle)")
        );
        assert_eq!((g[0].first_ms, g[0].last_ms), (Some(1_000), Some(1_059)));
        assert_eq!(g[0].nodes, vec![("n2".to_owned(), 40), ("n1".to_owned(), 20)]);
        assert_eq!(g[0].attempts, vec![(1, 30), (2, 30)]);
        assert_eq!(g[0].shards.len(), 60);
        assert_eq!((g[1].count, g[1].retrying, g[1].failed), (2, 1, 1));
        assert_eq!(g[1].shards[0].shard, 98, "lowest first");
        assert_eq!(g[1].nodes, vec![("?".to_owned(), 1)]);
        assert_eq!(parse(Some("12 3 node a b")), (Some(12), Some(3), Some("node a b".into())));
        assert_eq!(parse(Some("x")), (None, None, None));
    }
}
