//! Bounded reads for a dashboard: a page of tasks and a page of a task's failed shards (a
//! task's shard map: [`crate::shard_map`]; the event log's tail: [`crate::events::newest`]).
//! Each read costs what it returns, never the number of shards or of finished tasks
//! (docs/design/dashboard.md).

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_common::{Home, Keys, Result};

/// Most index entries a filtered task page looks at.
pub const MAX_SCAN: u64 = 5_000;
/// Most tasks, failed shards or events in one page.
pub const MAX_PAGE: u64 = 200;

/// The task fields a listing reads: all but the payload and the result, which may be large
/// (up to 1 MiB each) and which a list does not show (a halt's reason and the first failure are
/// one line each, cut).
const LIST_FIELDS: &[&str] = &[
    "seq",
    "inc",
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
    "agg_error",
    "partitions",
    "weight",
    "group",
    "max_running",
    "max_failures",
    "success_when",
    "cancelled",
    "halted",
    "first_failure",
    "speculate",
    "spec_started",
    "spec_won",
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
    home: &Home,
    filter: TaskFilter,
    offset: u64,
    limit: u64,
) -> Result<TaskPage> {
    let limit = limit.clamp(1, MAX_PAGE);
    let index = match filter {
        TaskFilter::All => home.index(),
        TaskFilter::Unfinished => home.running(),
        TaskFilter::Finished => home.finished(),
        TaskFilter::State(s) if s.is_finished() => home.finished(),
        TaskFilter::State(_) => home.running(),
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
        let infos = tasks_without_payload(con, home, &ids).await?;
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

/// The tasks of `ids` without payload and result, in their order, read in one pipeline; `None`
/// for one gone meanwhile.
pub async fn tasks_without_payload<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    ids: &[String],
) -> Result<Vec<Option<TaskInfo>>> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("HMGET").arg(home.task(id)).arg(LIST_FIELDS);
    }
    let rows: Vec<Vec<Option<String>>> = pipe.query_async(con).await?;
    let mut out = Vec::with_capacity(ids.len());
    for (id, row) in ids.iter().zip(rows) {
        let h: std::collections::HashMap<String, String> =
            LIST_FIELDS.iter().zip(row).filter_map(|(f, v)| v.map(|v| ((*f).to_owned(), v))).collect();
        let mut t = TaskInfo::from_hash(id, &h)?;
        if let Some(t) = t.as_mut() {
            crate::progress::live_counts(con, home, t).await?;
        }
        out.push(t);
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
    /// `failed` (for good), `retrying` (it runs again), or `cancelled` (it was to run again, but
    /// its task was cancelled).
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

/// One `HSCAN` page (about `count` entries) of the reasons of task `t`, from `cursor` ("0"
/// first).
pub async fn reason_page<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    t: &TaskInfo,
    cursor: &str,
    count: u64,
) -> Result<ReasonPage> {
    let bad = || shardctl_common::Error::invalid(format!("cursor '{cursor}' is not a cursor of this list"));
    // the reasons of its shares one after the other, the cursor `<partition>.<cursor>` (a plain
    // number for the first share)
    let shares = shardctl_common::share::of(con, home, t).await?;
    let (at, cursor) = match cursor.split_once('.') {
        Some((p, c)) => {
            let p: u32 = p.parse().map_err(|_| bad())?;
            (shares.iter().position(|s| s.partition == p).ok_or_else(bad)?, c)
        }
        None => (0, cursor),
    };
    let cursor: u64 = cursor.parse().map_err(|_| bad())?;
    let Some(s) = shares.get(at) else { return Ok(ReasonPage { shards: Vec::new(), next_cursor: None }) };
    // a share of another incarnation under the id (a leftover) shows nothing
    let ours = s.is_home() || shardctl_common::share::read(con, &s.keys, &t.task_id, &t.inc, &[]).await?.is_some();
    let mut page = if ours {
        space_reasons(con, &s.keys, t, cursor, count, s.base).await?
    } else {
        ReasonPage { shards: Vec::new(), next_cursor: None }
    };
    page.next_cursor = match (page.next_cursor.take(), shares.get(at + 1)) {
        (Some(c), _) if at == 0 => Some(c),
        (Some(c), _) => Some(format!("{}.{c}", s.partition)),
        (None, Some(next)) => Some(format!("{}.0", next.partition)),
        (None, None) => None,
    };
    Ok(page)
}

/// One page of the reasons stored in `keys`' keyspace, the shards shown at `base` + index.
pub(crate) async fn space_reasons<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    t: &TaskInfo,
    cursor: u64,
    count: u64,
    base: u64,
) -> Result<ReasonPage> {
    let id = t.task_id.as_str();
    let ended = t.state.is_finished();
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
            shard: base + shard,
            reason,
            state: match (bit == 1, ended) {
                (true, _) => "failed",
                (false, false) => "retrying",
                (false, true) => "cancelled",
            },
        })
        .collect();
    Ok(ReasonPage { shards, next_cursor: (next != 0).then(|| next.to_string()) })
}
