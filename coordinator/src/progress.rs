//! Reading progress: one task's state and counts, a queue's counts, the failed shards.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Error, Keys, Result};

/// One task, read from Redis.
pub async fn task<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<TaskInfo> {
    let h: HashMap<String, String> = redis::cmd("HGETALL").arg(keys.task(id)).query_async(con).await?;
    TaskInfo::from_hash(id, &h)?.ok_or_else(|| Error::NoTask(id.to_owned()))
}

/// A queue's counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueCounts {
    /// The queue's name.
    pub queue: String,
    /// Claims are stopped.
    pub paused: bool,
    /// Shards ready now: explicit refs plus untaken indexes of runnable tasks.
    pub waiting: u64,
    /// Shards being run.
    pub active: u64,
    /// Shards waiting for a retry.
    pub delayed: u64,
    /// Tasks by state.
    pub tasks: HashMap<String, u64>,
    /// The most recent tasks (newest first).
    pub recent: Vec<TaskInfo>,
}

/// The counts of a queue, with its `recent` newest tasks.
pub async fn queue<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    queue: &str,
    recent: usize,
) -> Result<QueueCounts> {
    let (paused, wait, active, delayed, runnable, ids): (Option<String>, u64, u64, u64, Vec<String>, Vec<String>) =
        redis::pipe()
            .hget(keys.meta(), "paused")
            .llen(keys.wait())
            .zcard(keys.active())
            .zcard(keys.delayed())
            .zrange(keys.tasks(), 0, -1)
            .zrevrange(keys.index(), 0, -1)
            .query_async(con)
            .await?;
    let mut out = QueueCounts {
        queue: queue.to_owned(),
        paused: paused.as_deref() == Some("1"),
        waiting: wait,
        active,
        delayed,
        ..Default::default()
    };
    for id in &runnable {
        let (cursor, total): (Option<u64>, Option<u64>) =
            redis::cmd("HMGET").arg(keys.task(id)).arg("cursor").arg("total").query_async(con).await?;
        out.waiting += total.unwrap_or(0).saturating_sub(cursor.unwrap_or(0));
    }
    for (n, id) in ids.iter().enumerate() {
        let state: Option<String> = redis::cmd("HGET").arg(keys.task(id)).arg("state").query_async(con).await?;
        let Some(state) = state else { continue };
        *out.tasks.entry(state).or_default() += 1;
        if n < recent {
            if let Ok(t) = task(con, keys, id).await {
                out.recent.push(t);
            }
        }
    }
    Ok(out)
}

/// Failed shards of a task with their reasons, by index.
pub async fn failed_shards<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<Vec<(u64, String)>> {
    let h: HashMap<String, String> = redis::cmd("HGETALL").arg(keys.errors(id)).query_async(con).await?;
    let mut v: Vec<(u64, String)> = h.into_iter().filter_map(|(k, r)| k.parse().ok().map(|i| (i, r))).collect();
    v.sort();
    Ok(v)
}
