//! Why a task does not move: what a waiter says instead of looking hung. Each reason is read
//! from Redis (by the server's clock) when a task has shown no progress for a while.

use std::fmt;

use redis::aio::ConnectionLike;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_common::time::server_now_ms;
use shardctl_common::{Home, Result};

/// Why a task that has not ended is not moving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stuck {
    /// The queue is paused.
    Paused,
    /// The task starts at this time (ms, the server's clock), this far from now.
    Delayed {
        /// Milliseconds from now.
        in_ms: u64,
    },
    /// No executor is live in the queue: none ever joined, or the last one was seen this long
    /// ago (ms).
    NoExecutor {
        /// Since the last one counted as alive, if any was ever seen.
        last_seen_ms_ago: Option<u64>,
    },
    /// Executors are live, and none serves the task's kind: its shards wait in its lane.
    Unserved {
        /// The task's kind.
        kind: String,
        /// The kinds the live executors serve.
        served: Vec<String>,
    },
    /// The task holds as many shards as its cap (`--max-running`): its other shards wait for
    /// one to end.
    Capped {
        /// Shards it holds.
        running: u64,
        /// Its cap.
        cap: u64,
    },
    /// Its group holds as many shards as the group's cap (`config --group-max-running`).
    GroupCapped {
        /// The group.
        group: String,
        /// Shards the group's tasks hold.
        running: u64,
        /// The group's cap.
        cap: u64,
    },
    /// Its shards fail because their `--worker` cannot start (a missing module, a bad path):
    /// they retry after their backoff, and will fail the same way.
    FailsToStart {
        /// The task's kind.
        kind: String,
        /// The start's error, summed up (`shardctl_common::reason::summary`).
        reason: String,
    },
    /// Its shards fail an attempt and wait to retry after their backoff.
    Retrying {
        /// Of the failing shards read, how many wait to retry.
        shards: u64,
        /// One's reason, summed up.
        reason: String,
    },
    /// The queue's rate limit lets no more shards start in its window.
    RateLimited {
        /// Starts allowed per window.
        max: u64,
        /// The window (ms).
        per_ms: u64,
    },
    /// The task ended, and no replica has confirmed its end yet (durability `replica`,
    /// docs/design/durability.md): `wait` returns it once one has.
    Unconfirmed {
        /// How it ended.
        state: String,
    },
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stuck::Paused => f.write_str("the queue is paused (shardctl resume restarts it)"),
            Stuck::Delayed { in_ms } => write!(f, "the task is delayed: it starts in {:.1} s", *in_ms as f64 / 1000.0),
            Stuck::NoExecutor { last_seen_ms_ago: None } => {
                f.write_str("no executor is running for this queue (none has joined it)")
            }
            Stuck::NoExecutor { last_seen_ms_ago: Some(ms) } => write!(
                f,
                "no executor is running for this queue (the last one was seen {:.0} s ago)",
                *ms as f64 / 1000.0
            ),
            Stuck::Unserved { kind, served } => write!(
                f,
                "no live executor serves kind '{kind}'; served: {} (start one with --kinds {kind})",
                if served.is_empty() { "none".to_owned() } else { served.join(", ") }
            ),
            Stuck::Capped { running, cap } => {
                write!(f, "capped: {running} of {cap} running (--max-running); the others wait for one to end")
            }
            Stuck::GroupCapped { group, running, cap } => {
                write!(f, "capped: its group '{group}' runs {running} of {cap} (--group-max-running); the others wait")
            }
            Stuck::FailsToStart { kind, reason } => {
                write!(f, "the worker of kind '{kind}' fails to start, its shards retry in vain: {reason}")
            }
            Stuck::Retrying { shards, reason } => {
                let n = if *shards >= SAMPLED { format!("{shards} or more") } else { shards.to_string() };
                write!(f, "{n} of its shards failed an attempt and wait to retry (status --failed lists them once failed for good): {reason}")
            }
            Stuck::RateLimited { max, per_ms } => {
                write!(f, "the queue's rate limit ({max} per {per_ms} ms) lets no more shards start for now")
            }
            Stuck::Unconfirmed { state } => write!(
                f,
                "it ended ({state}), and no replica has confirmed that yet (durability replica; shardctl status \
                 says which slot has none in sync)"
            ),
        }
    }
}

/// The reasons task `t` may not be moving, most likely first; empty when none is known (the
/// executors are busy with other work, or its shards are long).
pub async fn reasons<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Vec<Stuck>> {
    let mut out = Vec::new();
    if t.state.is_finished() {
        return Ok(out);
    }
    let now = server_now_ms(con, home).await?;
    let (paused, limit_max, limit_per, limit_used): (Option<String>, Option<u64>, Option<u64>, Option<u64>) =
        redis::cmd("HMGET")
            .arg(home.meta())
            .arg(&["paused", "limit_max", "limit_per_ms", "limit_used"])
            .query_async(con)
            .await?;
    if paused.as_deref() == Some("1") {
        out.push(Stuck::Paused);
    }
    if t.state == TaskState::Delayed {
        if let Some(start) = t.start_ms.filter(|&s| s > now) {
            out.push(Stuck::Delayed { in_ms: start - now });
        }
    }
    // the nodes' scores are the times they count as alive until
    let newest: Vec<(String, u64)> =
        redis::cmd("ZRANGE").arg(home.nodes()).arg(-1).arg(-1).arg("WITHSCORES").query_async(con).await?;
    match newest.first() {
        None => {
            // every one left (or was reaped): `meta` keeps when the last did
            let left: Option<u64> = redis::cmd("HGET").arg(home.meta()).arg("last_left_ms").query_async(con).await?;
            out.push(Stuck::NoExecutor { last_seen_ms_ago: left.map(|l| now.saturating_sub(l)) })
        }
        Some((_, until)) if *until <= now => out.push(Stuck::NoExecutor { last_seen_ms_ago: Some(now - until) }),
        Some(_) => {
            // live executors: do any serve the kind? (`None`: one serves every kind, or an older
            // one announced nothing)
            if let Some(served) = crate::membership::served_kinds(con, home).await? {
                if !served.contains(&t.kind) {
                    out.push(Stuck::Unserved { kind: t.kind.clone(), served: served.into_iter().collect() });
                }
            }
        }
    }
    // held back by a cap, with fresh shards left (docs/design/fairness.md)
    if t.max_running.is_some() || t.group.is_some() {
        let (running, group_running) = shardctl_common::share::held(con, home, t).await?;
        if let Some(cap) = t.max_running.filter(|&c| running >= c) {
            out.push(Stuck::Capped { running, cap });
        }
        if let (Some(g), Some(n)) = (&t.group, group_running) {
            let cap: Option<u64> =
                redis::cmd("HGET").arg(home.meta()).arg(format!("group_cap:{g}")).query_async(con).await?;
            if let Some(cap) = cap.filter(|&c| n >= c) {
                out.push(Stuck::GroupCapped { group: g.clone(), running: n, cap });
            }
        }
    }
    out.extend(retrying(con, home, t).await?);
    if let (Some(max), Some(per)) = (limit_max.filter(|&m| m > 0), limit_per) {
        if limit_used.unwrap_or(0) >= max {
            out.push(Stuck::RateLimited { max, per_ms: per });
        }
    }
    Ok(out)
}

/// How many failing shards' reasons [`retrying`] reads at most.
const SAMPLED: u64 = 50;

/// Whether shards of `t` failed an attempt and wait to retry (reasons without their terminal bit,
/// among the first [`SAMPLED`] of its home's `:errors`; a task spread over partitions keeps them
/// in its shares, not read here): a worker that cannot start first (every attempt will fail).
async fn retrying<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &TaskInfo) -> Result<Option<Stuck>> {
    use shardctl_common::reason::{summary, START_FAILED};
    // a settled task's unfinished shards were cancelled, not retrying
    if t.partitions > 1 || t.cancelled.is_some() {
        return Ok(None);
    }
    let (_, flat): (u64, Vec<String>) =
        redis::cmd("HSCAN").arg(home.errors(&t.task_id)).arg(0).arg("COUNT").arg(SAMPLED).query_async(con).await?;
    let pairs: Vec<(u64, String)> =
        flat.chunks(2).filter_map(|p| Some((p.first()?.parse().ok()?, p.get(1)?.clone()))).collect();
    if pairs.is_empty() {
        return Ok(None);
    }
    let mut pipe = redis::pipe();
    for (i, _) in &pairs {
        pipe.cmd("GETBIT").arg(home.terminal(&t.task_id)).arg(i);
    }
    let bits: Vec<u8> = pipe.query_async(con).await?;
    let waiting: Vec<&String> = pairs.iter().zip(bits).filter(|(_, b)| *b == 0).map(|((_, r), _)| r).collect();
    if let Some(r) = waiting.iter().find(|r| r.starts_with(START_FAILED)) {
        let reason = summary(&r[START_FAILED.len()..]);
        return Ok(Some(Stuck::FailsToStart { kind: t.kind.clone(), reason }));
    }
    Ok(waiting.first().map(|r| Stuck::Retrying { shards: waiting.len() as u64, reason: summary(r) }))
}
