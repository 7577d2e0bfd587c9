//! One reading of a queue's progress for the coordinator's gauges ([`crate::metrics`]): the
//! running tasks and those finished within the retention, with the queue's shard counts.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::{Home, Result};

use crate::membership;
use crate::progress::{self, ShardCounts};

/// One task's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskProgress {
    /// Task id.
    pub id: String,
    /// Handler kind.
    pub kind: String,
    /// Lifecycle state (`running`, `aggregating`, `completed`, `failed`).
    pub state: String,
    /// Shards.
    pub total: u64,
    /// Shards completed.
    pub done: u64,
    /// Shards failed for good.
    pub failed: u64,
}

impl TaskProgress {
    /// Terminal shards over the total, 0 to 1 (1 for a task without shards).
    pub fn ratio(&self) -> f64 {
        if self.total == 0 {
            return 1.0;
        }
        ((self.done + self.failed) as f64 / self.total as f64).min(1.0)
    }
}

/// One group's load (docs/design/fairness.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupLoad {
    /// Shards its tasks hold (running, or claimed to start next).
    pub running: u64,
    /// Shards of its running tasks not handed out yet.
    pub waiting: u64,
}

/// One reading of a queue's progress.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The groups of its tasks, by name.
    pub groups: std::collections::BTreeMap<String, GroupLoad>,
    /// Waiting, active and delayed shards.
    pub counts: ShardCounts,
    /// The running tasks, then those finished within the retention.
    pub tasks: Vec<TaskProgress>,
    /// Tasks not finished.
    pub running_tasks: u64,
    /// Tasks finished within the retention in state `failed`.
    pub failed_tasks: u64,
    /// Live executors.
    pub live: usize,
}

/// Reads the queue's progress: the running tasks and those finished since `now - retention`.
pub async fn snapshot(con: &mut Conn, home: &Home, now_ms: u64, retention: Duration) -> Result<Snapshot> {
    let since = now_ms.saturating_sub(retention.as_millis() as u64);
    let (running, finished): (Vec<String>, Vec<String>) = redis::pipe()
        .zrange(home.running(), 0, -1)
        .zrangebyscore(home.finished(), since, "+inf")
        .query_async(con)
        .await?;
    // a task is in one of the two sets; a reading that races its end may see it in both
    let mut seen = HashSet::new();
    let ids: Vec<&String> = running.iter().chain(&finished).filter(|id| seen.insert(id.as_str())).collect();
    let mut out = Snapshot { running_tasks: running.len() as u64, ..Default::default() };
    if !ids.is_empty() {
        // what the live counts need of each task (no payload)
        const FIELDS: [&str; 12] = [
            "kind",
            "state",
            "total",
            "done",
            "failed",
            "partitions",
            "inc",
            "seq",
            "strategy",
            "cursor",
            "routed",
            "group",
        ];
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(home.task(id)).arg(&FIELDS);
        }
        let rows: Vec<Vec<Option<String>>> = pipe.query_async(con).await?;
        for (id, row) in ids.into_iter().zip(rows) {
            let h: HashMap<String, String> =
                FIELDS.iter().zip(row).filter_map(|(f, v)| v.map(|v| (f.to_string(), v))).collect();
            // removed meanwhile
            if !h.contains_key("kind") || !h.contains_key("state") {
                continue;
            }
            let Some(mut t) = shardctl_common::model::TaskInfo::from_hash(id, &h)? else { continue };
            // its shares' live counts (none to read for a task of one partition)
            progress::live_counts(con, home, &mut t).await?;
            let (kind, state) = (h["kind"].clone(), h["state"].clone());
            let (total, done, failed) = (Some(t.total), Some(t.done), Some(t.failed));
            if state == "failed" {
                out.failed_tasks += 1;
            }
            if let Some(g) = t.group.as_ref().filter(|_| state == "running") {
                out.groups.entry(g.clone()).or_default().waiting += t.total.saturating_sub(t.cursor);
            }
            out.tasks.push(TaskProgress {
                id: id.clone(),
                kind,
                state,
                total: total.unwrap_or(0),
                done: done.unwrap_or(0),
                failed: failed.unwrap_or(0),
            });
        }
    }
    // what each group holds, over the queue's keyspaces
    for (f, n) in progress::held_counts(con, home).await? {
        if let Some(g) = f.strip_prefix("g:") {
            out.groups.entry(g.to_owned()).or_default().running += n;
        }
    }
    out.counts = progress::shard_counts(con, home).await?;
    out.live = membership::live(con, home).await?.len();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_counts_terminal_shards() {
        let t =
            TaskProgress { id: "t".into(), kind: "k".into(), state: "running".into(), total: 8, done: 3, failed: 1 };
        assert_eq!(t.ratio(), 0.5);
        assert_eq!(TaskProgress { total: 0, done: 0, failed: 0, ..t.clone() }.ratio(), 1.0);
        assert_eq!(TaskProgress { done: 8, failed: 0, ..t }.ratio(), 1.0);
    }
}
