//! Bounded reads for a dashboard: a page of tasks, a page of a task's failed shards, the tail of
//! the event log, and a task's shard map. Each read costs what it returns, never the number of
//! shards or of finished tasks (ARCHITECTURE.md, "Dashboard").

use std::collections::HashSet;

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_common::{Keys, Result};

/// Most cells of a shard map.
pub const MAX_CELLS: u64 = 20_000;
/// Bytes of the terminal bitmap read per `GETRANGE`.
const BITMAP_CHUNK: u64 = 64 * 1024;
/// Most failure reasons a shard map reads; past them it says its failures are incomplete.
pub const MAX_REASONS: usize = 100_000;
/// Most index entries a filtered task page looks at.
pub const MAX_SCAN: u64 = 5_000;
/// Most tasks, failed shards or events in one page.
pub const MAX_PAGE: u64 = 200;

/// The task fields a listing reads: all but the payload, which may be large.
const LIST_FIELDS: &[&str] = &[
    "seq",
    "kind",
    "state",
    "total",
    "items",
    "done",
    "failed",
    "cursor",
    "attempts",
    "backoff",
    "strategy",
    "routed",
    "vnodes",
    "has_keys",
    "shard_timeout_ms",
    "start_ms",
    "keep_results",
    "retain_ms",
    "created_ms",
    "finished_ms",
    "retried_ms",
    "result",
    "agg_error",
];

/// Which tasks a page lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskFilter {
    /// Every task, newest first.
    All,
    /// The tasks not finished (running, delayed, aggregating), newest first.
    Unfinished,
    /// The finished tasks, last ended first.
    Finished,
    /// The tasks in one state.
    State(TaskState),
}

impl std::str::FromStr for TaskFilter {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "" | "all" => Ok(TaskFilter::All),
            "unfinished" => Ok(TaskFilter::Unfinished),
            "finished" => Ok(TaskFilter::Finished),
            s => s.parse::<TaskState>().map(TaskFilter::State).map_err(|_| {
                format!(
                    "unknown state filter '{s}': all, unfinished, finished, running, delayed, aggregating, \
                     completed, failed or cancelled"
                )
            }),
        }
    }
}

/// One page of tasks.
#[derive(Debug, Clone, Serialize)]
pub struct TaskPage {
    /// The tasks (without their payloads).
    pub tasks: Vec<TaskInfo>,
    /// Where this page started in the filter's index.
    pub offset: u64,
    /// Where the next page starts, if there may be more.
    pub next_offset: Option<u64>,
    /// Entries of the index the filter reads (for a state filter, more than match).
    pub indexed: u64,
}

/// A page of at most `limit` tasks of `filter`, starting at `offset` of its index; a state
/// filter looks at no more than [`MAX_SCAN`] entries, and says where to go on.
pub async fn task_page<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    filter: TaskFilter,
    offset: u64,
    limit: u64,
) -> Result<TaskPage> {
    let limit = limit.clamp(1, MAX_PAGE);
    let index = match filter {
        TaskFilter::All => keys.index(),
        TaskFilter::Unfinished => keys.running(),
        TaskFilter::Finished => keys.finished(),
        TaskFilter::State(s) if s.is_finished() => keys.finished(),
        TaskFilter::State(_) => keys.running(),
    };
    let indexed: u64 = redis::cmd("ZCARD").arg(&index).query_async(con).await?;
    let mut page = TaskPage { tasks: Vec::new(), offset, next_offset: None, indexed };
    let mut at = offset;
    while (page.tasks.len() as u64) < limit && at < indexed && at - offset < MAX_SCAN {
        let chunk = if matches!(filter, TaskFilter::State(_)) { MAX_PAGE } else { limit - page.tasks.len() as u64 };
        let ids: Vec<String> = redis::cmd("ZREVRANGE").arg(&index).arg(at).arg(at + chunk - 1).query_async(con).await?;
        if ids.is_empty() {
            break;
        }
        let infos = tasks_without_payload(con, keys, &ids).await?;
        for (i, t) in infos.into_iter().enumerate() {
            let Some(t) = t else { continue };
            if let TaskFilter::State(s) = filter {
                if t.state != s {
                    continue;
                }
            }
            page.tasks.push(t);
            if page.tasks.len() as u64 == limit {
                at += i as u64 + 1;
                break;
            }
        }
        if (page.tasks.len() as u64) < limit {
            at += ids.len() as u64;
        }
    }
    if at < indexed {
        page.next_offset = Some(at);
    }
    Ok(page)
}

/// The tasks of `ids`, in their order, read in one pipeline; `None` for one gone meanwhile.
async fn tasks_without_payload<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    ids: &[String],
) -> Result<Vec<Option<TaskInfo>>> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("HMGET").arg(keys.task(id)).arg(LIST_FIELDS);
    }
    let rows: Vec<Vec<Option<String>>> = pipe.query_async(con).await?;
    let mut out = Vec::with_capacity(ids.len());
    for (id, row) in ids.iter().zip(rows) {
        let h: std::collections::HashMap<String, String> =
            LIST_FIELDS.iter().zip(row).filter_map(|(f, v)| v.map(|v| ((*f).to_owned(), v))).collect();
        out.push(TaskInfo::from_hash(id, &h)?);
    }
    Ok(out)
}

/// One failed (or retrying) shard with its last reason.
#[derive(Debug, Clone, Serialize)]
pub struct ShardReason {
    /// The shard's index.
    pub shard: u64,
    /// Its last failure reason.
    pub reason: String,
    /// `failed` (for good), or `retrying` (it runs again).
    pub state: &'static str,
}

/// One page of a task's failure reasons.
#[derive(Debug, Clone, Serialize)]
pub struct ReasonPage {
    /// The shards of this page, by index.
    pub shards: Vec<ShardReason>,
    /// The cursor of the next page; `None` at the end.
    pub next_cursor: Option<String>,
}

/// One `HSCAN` page (about `count` entries) of the task's reasons, from `cursor` ("0" first).
pub async fn reason_page<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    id: &str,
    cursor: &str,
    count: u64,
) -> Result<ReasonPage> {
    shardctl_common::names::validate_task_id(id)?;
    let cursor: u64 =
        cursor.parse().map_err(|_| shardctl_common::Error::invalid(format!("cursor '{cursor}' is not a number")))?;
    let (next, flat): (u64, Vec<String>) = redis::cmd("HSCAN")
        .arg(keys.errors(id))
        .arg(cursor)
        .arg("COUNT")
        .arg(count.clamp(1, MAX_PAGE))
        .query_async(con)
        .await?;
    let mut pairs: Vec<(u64, String)> =
        flat.chunks(2).filter_map(|p| Some((p.first()?.parse().ok()?, p.get(1)?.clone()))).collect();
    pairs.sort_by_key(|p| p.0);
    let mut pipe = redis::pipe();
    for (i, _) in &pairs {
        pipe.cmd("GETBIT").arg(keys.terminal(id)).arg(i);
    }
    let bits: Vec<u8> = if pairs.is_empty() { Vec::new() } else { pipe.query_async(con).await? };
    let shards = pairs
        .into_iter()
        .zip(bits)
        .map(|((shard, reason), bit)| ShardReason {
            shard,
            reason,
            state: if bit == 1 { "failed" } else { "retrying" },
        })
        .collect();
    Ok(ReasonPage { shards, next_cursor: (next != 0).then(|| next.to_string()) })
}

/// A task's shards as cells, each a run of consecutive shards coloured by its worst member.
#[derive(Debug, Clone, Serialize)]
pub struct ShardMap {
    /// Shards of the task.
    pub total: u64,
    /// Shards per cell (the last cell may hold fewer).
    pub per_cell: u64,
    /// One letter per cell: `f` failed, `r` running, `y` retrying, `p` pending, `d` done (the
    /// first of these its shards have, in this order).
    pub cells: String,
    /// Shards held by an executor now.
    pub running: u64,
    /// Shards not terminal with a failure reason stored (they run again).
    pub retrying: u64,
    /// Whether every failure reason was read; past [`MAX_REASONS`] some failed shards may be
    /// drawn as done.
    pub reasons_complete: bool,
}

/// Reads the shard map of `t` in bounded steps: the terminal bitmap in 64 KiB chunks, the held
/// refs of the task and its reasons by `HSCAN`. At most `max_cells` (≤ [`MAX_CELLS`]) cells.
pub async fn shard_map<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    let total = t.total;
    let cells_wanted = max_cells.clamp(1, MAX_CELLS);
    let per_cell = total.div_ceil(cells_wanted).max(1);
    // the terminal bitmap, chunk by chunk
    let bytes_needed = total.div_ceil(8);
    let mut bitmap: Vec<u8> = Vec::with_capacity(bytes_needed as usize);
    let mut from = 0u64;
    while from < bytes_needed {
        let to = (from + BITMAP_CHUNK).min(bytes_needed) - 1;
        let part: Vec<u8> =
            redis::cmd("GETRANGE").arg(keys.terminal(&t.task_id)).arg(from).arg(to).query_async(con).await?;
        let short = (part.len() as u64) < to - from + 1;
        bitmap.extend_from_slice(&part);
        if short {
            break; // the rest is zeros: Redis returns only what the string holds
        }
        from = to + 1;
    }
    let terminal = |i: u64| bitmap.get((i / 8) as usize).is_some_and(|b| b & (0x80 >> (i % 8)) != 0);
    // the shards held now: refs `<id>:<seq>:<index>` in `active`
    let pattern = format!("{}:{}:*", t.task_id, t.seq);
    let mut running = HashSet::new();
    for (field, _) in hscan(con, &keys.active(), Some(&pattern), usize::MAX).await?.0 {
        if let Some(i) = field.rsplit(':').next().and_then(|i| i.parse::<u64>().ok()) {
            running.insert(i);
        }
    }
    let (reasons, reasons_complete) = hscan(con, &keys.errors(&t.task_id), None, MAX_REASONS).await?;
    let reasons: HashSet<u64> = reasons.iter().filter_map(|(k, _)| k.parse().ok()).collect();
    let mut cells = String::with_capacity(total.div_ceil(per_cell) as usize);
    let mut retrying = 0u64;
    let mut start = 0u64;
    while start < total {
        let end = (start + per_cell).min(total);
        let mut worst = 0u8; // 0 done, 1 pending, 2 retrying, 3 running, 4 failed
        for i in start..end {
            let rank = match (terminal(i), reasons.contains(&i), running.contains(&i)) {
                (true, true, _) => 4,
                (true, false, _) => 0,
                (false, _, true) => 3,
                (false, true, false) => 2,
                (false, false, false) => 1,
            };
            if !terminal(i) && reasons.contains(&i) {
                retrying += 1;
            }
            worst = worst.max(rank);
        }
        cells.push(['d', 'p', 'y', 'r', 'f'][worst as usize]);
        start = end;
    }
    Ok(ShardMap { total, per_cell, cells, running: running.len() as u64, retrying, reasons_complete })
}

/// The fields (and values) of a hash by `HSCAN`, matching `pattern` if given, at most `cap`;
/// whether all were read.
async fn hscan<C: ConnectionLike + Send>(
    con: &mut C,
    key: &str,
    pattern: Option<&str>,
    cap: usize,
) -> Result<(Vec<(String, String)>, bool)> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(key).arg(cursor).arg("COUNT").arg(1000);
        if let Some(p) = pattern {
            cmd.arg("MATCH").arg(p);
        }
        let (next, flat): (u64, Vec<String>) = cmd.query_async(con).await?;
        out.extend(flat.chunks(2).filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone()))));
        if next == 0 {
            return Ok((out, true));
        }
        if out.len() >= cap {
            return Ok((out, false));
        }
        cursor = next;
    }
}

/// The newest `count` events of the queue's log (newest first), each as its id and fields.
pub async fn events_tail<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    count: u64,
) -> Result<Vec<(String, Vec<(String, String)>)>> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(keys.events())
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count.clamp(1, MAX_PAGE))
        .query_async(con)
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .map(|e| {
            let fields = e
                .map
                .iter()
                .map(|(k, v)| (k.clone(), redis::from_redis_value_ref::<String>(v).unwrap_or_default()))
                .collect();
            (e.id, fields)
        })
        .collect())
}
