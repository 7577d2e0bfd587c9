//! Reading progress: one task's state and counts, a queue's counts, the failed shards.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Error, Home, Keys, Result};

/// One task, read from Redis.
pub async fn task<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<TaskInfo> {
    shardctl_common::names::validate_task_id(id)?;
    let h: HashMap<String, String> = redis::cmd("HGETALL").arg(home.task(id)).query_async(con).await?;
    let mut t = TaskInfo::from_hash(id, &h)?.ok_or_else(|| Error::NoTask(id.to_owned()))?;
    live_counts(con, home, &mut t).await?;
    // over partitions its run times and completions over time are its shares' (docs/design/dashboard.md)
    if t.partitions > 1 {
        let timed = shardctl_common::share::timing(con, home, &t).await?;
        t.durations = timed.0.summary();
        (t.histogram, t.throughput) = timed;
    }
    if !t.state.is_finished() {
        t.running = Some(shardctl_common::share::held(con, home, &t).await?.0);
    }
    Ok(t)
}

/// The counts of `held` (docs/design/fairness.md) summed over the queue's keyspaces: task id or
/// `g:<group>` -> shards held now (running, or claimed to start next); usages left out.
pub async fn held_counts<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<HashMap<String, u64>> {
    let layout = shardctl_common::partition::layout(con, home).await?;
    let mut out: HashMap<String, u64> = HashMap::new();
    for k in layout.partitions.iter().chain([home.keys()]) {
        let h: HashMap<String, String> = redis::cmd("HGETALL").arg(k.held()).query_async(con).await?;
        for (f, v) in h.into_iter().filter(|(f, _)| !f.starts_with("u:")) {
            *out.entry(f).or_default() += v.parse::<u64>().unwrap_or(0);
        }
    }
    Ok(out)
}

/// Shards held now over the queue (the tasks' counts of [`held_counts`]).
pub async fn held_total<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<u64> {
    Ok(held_counts(con, home).await?.iter().filter(|(f, _)| !f.starts_with("g:")).map(|(_, n)| n).sum())
}

/// A task counts its shards in its home as each share ends: while it runs (or waits for its
/// start, or once it was cancelled or halted) its counts are its shares' (`shardctl_common::share::sums`:
/// one read per partition, none for a task of one partition, whose home record is its share),
/// never behind what the home has counted; a routed task's placement is its shares' in any
/// state.
pub async fn live_counts<C: ConnectionLike + Send>(con: &mut C, home: &Home, t: &mut TaskInfo) -> Result<()> {
    use shardctl_common::model::TaskState;
    // running, delayed, cancelled or halted (its shares' work is not reported once it is)
    let live = matches!(t.state, TaskState::Running | TaskState::Delayed | TaskState::Cancelled) || t.halted.is_some();
    // a task's backups for stragglers are counted in its shares, in any state
    let speculated = t.speculate.is_some() && t.partitions > 1;
    if !(live || t.strategy != "pull" || speculated) {
        return Ok(());
    }
    let sums = shardctl_common::share::sums(con, home, t).await?;
    if speculated {
        (t.spec_started, t.spec_won) = (sums.spec_started, sums.spec_won);
    }
    if t.strategy != "pull" {
        t.routed = Some(sums.routed);
    }
    if live {
        // never behind what the home has counted (a share removed after its report)
        t.done = t.done.max(sums.done);
        t.failed = t.failed.max(sums.failed);
        t.cursor = sums.cursor;
    }
    Ok(())
}

/// A queue's counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueCounts {
    /// The queue's name.
    pub queue: String,
    /// Claims are stopped.
    pub paused: bool,
    /// Shards ready now: explicit refs, routed refs, untaken indexes of runnable tasks.
    pub waiting: u64,
    /// Shards being run.
    pub active: u64,
    /// Shards waiting for a retry or for their task's start (`--delay`).
    pub delayed: u64,
    /// Tasks by state.
    pub tasks: HashMap<String, u64>,
    /// The most recent tasks (newest first).
    pub recent: Vec<TaskInfo>,
}

/// A queue's shard counts, as [`queue`] and the coordinator's metrics show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ShardCounts {
    /// Claims are stopped.
    pub paused: bool,
    /// Shards ready now: explicit refs, routed refs, untaken indexes of runnable tasks.
    pub waiting: u64,
    /// Shards being run.
    pub active: u64,
    /// Shards waiting for a retry or for their task's start (`--delay`).
    pub delayed: u64,
}

/// The shard counts of a queue: a few round trips whatever its size (one per kind of list), per
/// keyspace of a partitioned queue (its home and each partition, summed).
pub async fn shard_counts<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<ShardCounts> {
    let mut c = space_counts(con, home).await?;
    let layout = shardctl_common::partition::layout(con, home).await?;
    for pk in &layout.partitions {
        let p = space_counts(con, pk).await?;
        c.waiting += p.waiting;
        c.active += p.active;
        c.delayed += p.delayed;
    }
    Ok(c)
}

/// The shard counts of one keyspace.
async fn space_counts<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<ShardCounts> {
    #[allow(clippy::type_complexity)]
    let (paused, kinds, active, pinned, delayed, rerouted, routed_nodes, unrouted, scheduled): (
        Option<String>,
        Vec<String>,
        u64,
        bool,
        u64,
        u64,
        Vec<String>,
        Vec<String>,
        Vec<String>,
    ) = redis::pipe()
        .hget(keys.meta(), "paused")
        .smembers(keys.kinds())
        .hlen(keys.active())
        .hexists(keys.active(), ACTIVE_PIN)
        .zcard(keys.delayed())
        .llen(keys.reroute())
        .smembers(keys.routed_nodes())
        .zrange(keys.unrouted(), 0, -1)
        .zrange(keys.scheduled(), 0, -1)
        .query_async(con)
        .await?;
    // `active` keeps one pin field (see lua/include/hold.lua): it is not a shard
    let active = active.saturating_sub(u64::from(pinned));
    // explicit refs wait in their kinds' lanes, routed ones on their nodes' lists, recovered
    // routed ones in `reroute`
    let mut waiting = rerouted;
    let mut runnable = Vec::new();
    if !kinds.is_empty() {
        let mut pipe = redis::pipe();
        for k in &kinds {
            pipe.llen(keys.lane_wait(k)).zrange(keys.lane_tasks(k), 0, -1);
        }
        let lanes: Vec<(u64, Vec<String>)> = pipe.query_async(con).await?;
        for (wait, tasks) in lanes {
            waiting += wait;
            runnable.extend(tasks);
        }
    }
    if !routed_nodes.is_empty() {
        let mut pipe = redis::pipe();
        for n in &routed_nodes {
            pipe.llen(keys.node_wait(n));
        }
        let lens: Vec<u64> = pipe.query_async(con).await?;
        waiting += lens.iter().sum::<u64>();
    }
    // untaken indexes: of routed tasks not placed yet (no live executor, or placement under
    // way), and of runnable pull tasks
    for (ids, field) in [(&unrouted, "routed"), (&runnable, "cursor")] {
        if ids.is_empty() {
            continue;
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HMGET").arg(keys.task(id)).arg(field).arg("total");
        }
        let v: Vec<(Option<u64>, Option<u64>)> = pipe.query_async(con).await?;
        waiting += v.iter().map(|(taken, total)| total.unwrap_or(0).saturating_sub(taken.unwrap_or(0))).sum::<u64>();
    }
    // the shards of delayed tasks wait for their start, as retries for their due time
    let mut delayed = delayed;
    if !scheduled.is_empty() {
        let mut pipe = redis::pipe();
        for id in &scheduled {
            pipe.cmd("HMGET").arg(keys.task(id)).arg("total").arg("partitions");
        }
        let totals: Vec<(Option<u64>, Option<u32>)> = pipe.query_async(con).await?;
        // a task over partitions is counted by its shares (delayed in their partitions too)
        delayed += totals.iter().filter(|(_, k)| k.is_none_or(|k| k <= 1)).filter_map(|(t, _)| *t).sum::<u64>();
    }
    Ok(ShardCounts { paused: paused.as_deref() == Some("1"), waiting, active, delayed })
}

/// The counts of a queue, with its `recent` newest tasks.
pub async fn queue<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    queue: &str,
    recent: usize,
) -> Result<QueueCounts> {
    let c = shard_counts(con, home).await?;
    let mut out = QueueCounts {
        queue: queue.to_owned(),
        paused: c.paused,
        waiting: c.waiting,
        active: c.active,
        delayed: c.delayed,
        ..Default::default()
    };
    let ids: Vec<String> = redis::cmd("ZREVRANGE").arg(home.index()).arg(0).arg(-1).query_async(con).await?;
    for (n, id) in ids.iter().enumerate() {
        let state: Option<String> = redis::cmd("HGET").arg(home.task(id)).arg("state").query_async(con).await?;
        let Some(state) = state else { continue };
        *out.tasks.entry(state).or_default() += 1;
        if n < recent {
            if let Ok(t) = task(con, home, id).await {
                out.recent.push(t);
            }
        }
    }
    Ok(out)
}

/// Failed shards of a task with their reasons, by the task's index (every share's); none for a
/// task that is gone.
pub async fn failed_shards<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<Vec<(u64, String)>> {
    shardctl_common::names::validate_task_id(id)?;
    let h: HashMap<String, String> = redis::cmd("HGETALL").arg(home.task(id)).query_async(con).await?;
    match TaskInfo::from_hash(id, &h)? {
        Some(t) => shardctl_common::share::reasons(con, home, &t).await,
        None => Ok(Vec::new()),
    }
}

/// One live executor, as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    /// Node id.
    pub node: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: Option<u64>,
    /// Shards it runs at once.
    pub concurrency: Option<u64>,
    /// Milliseconds since its last membership heartbeat.
    pub heartbeat_age_ms: u64,
    /// Refs routed to it, waiting.
    pub waiting: u64,
    /// Shards it holds now.
    pub active: u64,
    /// The kinds it serves, joined by commas, or `*` for every kind.
    pub kinds: String,
    /// Milliseconds it has run: its own measure at its last heartbeat plus the time since (by
    /// the server's clock); since its node record was made, for an executor that says none.
    pub up_ms: u64,
    /// Shards it completed, and failed for good, since it started (as of its last heartbeat).
    pub done: u64,
    /// Shards it failed for good.
    pub failed: u64,
    /// Its longest running shards (at most 10), longest first.
    pub running: Vec<RunningShard>,
}

/// A shard an executor runs now (docs/design/dashboard.md, "Where time goes").
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RunningShard {
    /// Its task.
    pub task: String,
    /// Its index in the task.
    pub shard: u64,
    /// How long it has run (ms): its executor's measure at its last heartbeat, plus the time
    /// since that heartbeat.
    pub running_ms: u64,
}

/// Task `task`'s longest running shards, each with its node, longest first, at most `n`, from
/// the lists `nodes` published (each names its 10 longest running of any task).
pub fn longest_running(nodes: &[NodeStatus], task: &str, n: usize) -> Vec<(String, RunningShard)> {
    let mut all: Vec<(String, RunningShard)> = nodes
        .iter()
        .flat_map(|node| node.running.iter().filter(|r| r.task == task).map(|r| (node.node.clone(), r.clone())))
        .collect();
    all.sort_by(|a, b| b.1.running_ms.cmp(&a.1.running_ms).then_with(|| a.1.shard.cmp(&b.1.shard)));
    all.truncate(n);
    all
}

/// An executor's `live_running` field (`<task> <index> <ms>`, comma-separated), as of `age_ms`
/// ago; malformed entries are left out.
fn running_of(field: &str, age_ms: u64) -> Vec<RunningShard> {
    field
        .split(',')
        .filter_map(|e| {
            let mut p = e.split(' ');
            let (task, shard, ms) = (p.next()?, p.next()?.parse().ok()?, p.next()?.parse::<u64>().ok()?);
            shardctl_common::names::validate_task_id(task).ok()?;
            Some(RunningShard { task: task.to_owned(), shard, running_ms: ms.saturating_add(age_ms) })
        })
        .collect()
}

/// The live executors with their routed waiting and active shards.
pub async fn nodes<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Vec<NodeStatus>> {
    // scores are "alive until": the heartbeat plus the node's own timeout, by the server's clock
    let now = shardctl_common::time::server_now_ms(con, home).await?;
    let live: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
        .arg(home.nodes())
        .arg(format!("({now}"))
        .arg("+inf")
        .arg("WITHSCORES")
        .query_async(con)
        .await?;
    let mut out = Vec::new();
    let mut by_instance = HashMap::new();
    for (node, until) in live {
        let h: HashMap<String, String> = redis::cmd("HGETALL").arg(home.node(&node)).query_async(con).await?;
        let waiting: u64 = redis::cmd("LLEN").arg(home.node_wait(&node)).query_async(con).await?;
        if let Some(i) = h.get("instance") {
            by_instance.insert(i.clone(), out.len());
        }
        let get = |f: &str| h.get(f).cloned().unwrap_or_default();
        let since = |f: &str| get(f).parse::<u64>().map_or(0, |t| now.saturating_sub(t));
        out.push(NodeStatus {
            up_ms: match get("live_up_ms").parse::<u64>() {
                Ok(up) => up.saturating_add(since("live_at")),
                Err(_) => since("started_ms"),
            },
            done: get("live_done").parse().unwrap_or(0),
            failed: get("live_failed").parse().unwrap_or(0),
            running: running_of(&get("live_running"), since("live_at")),
            host: get("host"),
            pid: get("pid").parse().ok(),
            concurrency: get("concurrency").parse().ok(),
            heartbeat_age_ms: now.saturating_sub((until as u64).saturating_sub(get("timeout_ms").parse().unwrap_or(0))),
            kinds: get("kinds"),
            node,
            waiting,
            active: 0,
        });
    }
    // a token starts with its executor's instance: that names the node of an active shard; a
    // node's runtimes in the partitions hold shards and take routed refs there too
    let layout = shardctl_common::partition::layout(con, home).await?;
    for (n, space) in std::iter::once(home.keys()).chain(&layout.partitions).enumerate() {
        if n > 0 && !out.is_empty() {
            let mut pipe = redis::pipe();
            for s in &out {
                pipe.llen(space.node_wait(&s.node));
            }
            let lens: Vec<u64> = pipe.query_async(con).await?;
            for (s, len) in out.iter_mut().zip(lens) {
                s.waiting += len;
            }
        }
        let active: HashMap<String, String> = redis::cmd("HGETALL").arg(space.active()).query_async(con).await?;
        for t in active.values() {
            if let Some(&i) = t.split(':').next().and_then(|inst| by_instance.get(inst)) {
                out[i].active += 1;
            }
        }
    }
    Ok(out)
}
