//! Reading a queue's event log as one log: the home's, with the partitions' per-shard events
//! (`shard_*`) merged in at the task's indexes. Two readers: [`newest`] (the dashboard's tail)
//! and [`Follow`] (`shardctl watch`, live). The log is best effort (capped, never counted from:
//! docs/design/observability.md).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamRangeReply, StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use shardctl_common::conn::Conn;
use shardctl_common::partition::{self, Layout, LAYOUT_CHECK};
use shardctl_common::time::server_now_ms;
use shardctl_common::{Home, Keys, Result};

/// One event: its stream id (`<ms>-<seq>`) and its fields.
pub type Event = (String, Vec<(String, String)>);

/// Most events one read of a log returns.
const READ_COUNT: usize = 500;

/// The newest `count` (at most [`MAX_PAGE`](crate::inspect::MAX_PAGE)) events of the queue's
/// log (newest first). On a partitioned queue the partitions' per-shard events are merged in
/// (see [`as_task_event`]): K + 1 reads of `count` events, and one read per task met in a
/// partition.
pub async fn newest<C: ConnectionLike + Send>(con: &mut C, home: &Home, count: u64) -> Result<Vec<Event>> {
    let count = count.clamp(1, crate::inspect::MAX_PAGE);
    let mut out = newest_in(con, home, count).await?;
    let layout = partition::layout(con, home).await?;
    let mut bases = Bases::default();
    for (p, pk) in layout.partitions.iter().enumerate() {
        for (id, mut fields) in newest_in(con, pk, count).await? {
            let Some(task) = share_event_task(&fields) else { continue };
            let base = bases.of(con, pk, &task).await?;
            as_task_event(&mut fields, p as u32 + 1, base);
            out.push((id, fields));
        }
    }
    // newest first across the logs (the home's alone are so already)
    out.sort_by_key(|(id, _)| std::cmp::Reverse(order(id)));
    out.truncate(count as usize);
    Ok(out)
}

/// A log followed: its key, its partition (1-based number and keys; `None`: the home), the last
/// id read.
type Log = (String, Option<(u32, Keys)>, String);

/// The queue's log followed live, from now or from its start: each [`Follow::next`] returns the
/// events come since the last, in time order across the logs, their fields in a stable order
/// (`event`, `task`, `shard`, then by name). A change of the queue's partitions is followed:
/// the new partitions' logs are read from the check before the change was seen.
pub struct Follow {
    home: Home,
    /// For reads that do not block, and the partitions' bases.
    plain: Conn,
    /// A blocking read's own connection (its response timeout past the block).
    blocking: Conn,
    layout: Layout,
    /// Each log with its partition (1-based number and keys; `None`: the home) and the last id
    /// read.
    logs: Vec<Log>,
    bases: Bases,
    checked: Instant,
    checked_ms: u64,
}

impl Follow {
    /// Follows `home`'s log from its start, or from the server's time now (`"$"` would need a
    /// blocking read per log).
    pub async fn start(home: &Home, mut plain: Conn, blocking: Conn, from_start: bool) -> Result<Follow> {
        let layout = partition::layout(&mut plain, home).await?;
        let now = server_now_ms(&mut plain, home).await?;
        let start = if from_start { "0-0".to_owned() } else { format!("{now}-0") };
        let mut logs = vec![(home.events(), None, start.clone())];
        for (p, pk) in layout.partitions.iter().enumerate() {
            logs.push((pk.events(), Some((p as u32 + 1, pk.clone())), start.clone()));
        }
        Ok(Follow {
            home: home.clone(),
            plain,
            blocking,
            layout,
            logs,
            bases: Bases::default(),
            checked: Instant::now(),
            checked_ms: now,
        })
    }

    /// The next events, waiting for some (at most a few seconds: it may return none).
    pub async fn next(&mut self) -> Result<Vec<Event>> {
        self.follow_layout().await?;
        // the home blocks when it is the only log; the partitions' logs are read as they are,
        // with a pause when none had anything
        let alone = self.layout.partitions.is_empty();
        let mut round: Vec<Event> = Vec::new();
        for (key, partition, last) in self.logs.iter_mut() {
            let opts = StreamReadOptions::default().count(READ_COUNT);
            let (opts, con) = if partition.is_none() && alone {
                (opts.block(5000), &mut self.blocking)
            } else {
                (opts, &mut self.plain)
            };
            let reply: Option<StreamReadReply> = con.xread_options(&[&*key], &[&*last], &opts).await?;
            for entry in reply.map(|r| r.keys).unwrap_or_default().into_iter().flat_map(|s| s.ids) {
                *last = entry.id.clone();
                let (id, mut fields) = event(entry);
                if let Some((p, pk)) = partition {
                    let Some(task) = share_event_task(&fields) else { continue };
                    let base = self.bases.of(&mut self.plain, pk, &task).await?;
                    as_task_event(&mut fields, *p, base);
                }
                round.push((id, fields));
            }
        }
        if round.is_empty() && !alone {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        round.sort_by_key(|(id, _)| order(id));
        for (_, fields) in &mut round {
            let rank = |k: &str| match k {
                "event" => 0,
                "task" => 1,
                "shard" => 2,
                _ => 3,
            };
            fields.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
        }
        Ok(round)
    }

    /// Adds the logs of partitions that appeared since the last check (every [`LAYOUT_CHECK`]).
    async fn follow_layout(&mut self) -> Result<()> {
        if self.checked.elapsed() < LAYOUT_CHECK {
            return Ok(());
        }
        self.checked = Instant::now();
        let now_ms = server_now_ms(&mut self.plain, &self.home).await?;
        let since = std::mem::replace(&mut self.checked_ms, now_ms);
        let now = partition::layout(&mut self.plain, &self.home).await?;
        if now != self.layout {
            let from = format!("{since}-0");
            for (p, pk) in now.partitions.iter().enumerate() {
                if !self.logs.iter().any(|(k, _, _)| *k == pk.events()) {
                    self.logs.push((pk.events(), Some((p as u32 + 1, pk.clone())), from.clone()));
                }
            }
            self.layout = now;
        }
        Ok(())
    }
}

/// The task of a partition's event that the queue's log shows as its own: a per-shard event
/// (`shard_*`, `speculation_won`), or a share stopped as its home decided (`share_stopped`).
/// `None` for the others (a share's own dispatch or end: the home logs the task's).
pub fn share_event_task(fields: &[(String, String)]) -> Option<String> {
    let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    field("event").filter(|e| e.starts_with("shard_") || e == "share_stopped" || e == "speculation_won")?;
    Some(field("task").unwrap_or_default())
}

/// Makes a per-shard event of partition `partition`'s log (1-based) one of the queue's: its
/// shard at the task's index (`base`, the share's first, plus the share's index) and a field
/// `partition` naming the log, since an id is unique within one log only (`partition` and `id`
/// together are unique).
pub fn as_task_event(fields: &mut Vec<(String, String)>, partition: u32, base: u64) {
    for (k, v) in fields.iter_mut() {
        if k == "shard" {
            if let Ok(i) = v.parse::<u64>() {
                *v = (base + i).to_string();
            }
        }
    }
    fields.push(("partition".to_owned(), partition.to_string()));
}

/// An event's time order: its id's milliseconds, then its sequence number.
fn order(id: &str) -> (u64, u64) {
    let (ms, n) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), n.parse().unwrap_or(0))
}

/// The first task index of each share met in a partition's log (its record's `base`), read once
/// per share.
#[derive(Default)]
struct Bases(HashMap<(String, String), u64>);

impl Bases {
    async fn of<C: ConnectionLike + Send>(&mut self, con: &mut C, partition: &Keys, task: &str) -> Result<u64> {
        let at = (partition.events(), task.to_owned());
        if let Some(b) = self.0.get(&at) {
            return Ok(*b);
        }
        let b: Option<u64> = redis::cmd("HGET").arg(partition.task(task)).arg("base").query_async(con).await?;
        Ok(*self.0.entry(at).or_insert(b.unwrap_or(0)))
    }
}

/// The newest `count` entries of one keyspace's log, newest first.
async fn newest_in<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, count: u64) -> Result<Vec<Event>> {
    let reply: StreamRangeReply =
        redis::cmd("XREVRANGE").arg(keys.events()).arg("+").arg("-").arg("COUNT").arg(count).query_async(con).await?;
    Ok(reply.ids.into_iter().map(event).collect())
}

fn event(e: StreamId) -> Event {
    let fields = e.map.iter().map(|(k, v)| (k.clone(), redis::from_redis_value_ref::<String>(v).unwrap_or_default()));
    (e.id, fields.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_shard_event_is_shown_at_the_task_index() {
        let mut fields = vec![("event".to_owned(), "shard_failed".to_owned()), ("shard".to_owned(), "3".to_owned())];
        assert_eq!(share_event_task(&fields), Some(String::new()));
        as_task_event(&mut fields, 2, 100);
        assert_eq!(fields[1].1, "103");
        assert_eq!(fields[2], ("partition".to_owned(), "2".to_owned()));
        let own = vec![("event".to_owned(), "task_dispatched".to_owned())];
        assert_eq!(share_event_task(&own), None);
        assert!(order("12-3") < order("12-10") && order("12-10") < order("13-0"));
    }
}
