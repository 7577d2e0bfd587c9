//! Bounded reads for a dashboard: a page of tasks, a page of a task's failed shards, and a
//! task's shard map (the event log's tail: [`crate::events::newest`]). Each read costs what it
//! returns, never the number of shards or of finished tasks (docs/design/dashboard.md).

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_common::{Home, Keys, Result};

/// Most cells of a shard map.
pub const MAX_CELLS: u64 = 20_000;
/// Bytes of the terminal bitmap read per `GETRANGE`.
const BITMAP_CHUNK: u64 = 64 * 1024;
/// Most failure reasons whose indexes a shard map reads (their texts are never read); past
/// them it says its failures are incomplete.
pub const MAX_REASONS: usize = 1_000_000;
/// Most index entries a filtered task page looks at.
pub const MAX_SCAN: u64 = 5_000;
/// Most tasks, failed shards or events in one page.
pub const MAX_PAGE: u64 = 200;

/// The task fields a listing reads: all but the payload and the result, which may be large
/// (up to 1 MiB each) and which a list does not show.
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
    keys: &Home,
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

/// The tasks of `ids` without payload and result, in their order, read in one pipeline; `None`
/// for one gone meanwhile.
pub async fn tasks_without_payload<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Home,
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
        let mut t = TaskInfo::from_hash(id, &h)?;
        if let Some(t) = t.as_mut() {
            crate::progress::live_counts(con, keys, t).await?;
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
    keys: &Home,
    t: &TaskInfo,
    cursor: &str,
    count: u64,
) -> Result<ReasonPage> {
    let bad = || shardctl_common::Error::invalid(format!("cursor '{cursor}' is not a cursor of this list"));
    // the reasons of its shares one after the other, the cursor `<partition>.<cursor>` (a plain
    // number for the first share)
    let shares = shardctl_common::share::of(con, keys, t).await?;
    let (at, cursor) = match cursor.split_once('.') {
        Some((p, c)) => {
            let p: u32 = p.parse().map_err(|_| bad())?;
            (shares.iter().position(|s| s.part == p).ok_or_else(bad)?, c)
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
        (Some(c), _) => Some(format!("{}.{c}", s.part)),
        (None, Some(next)) => Some(format!("{}.0", next.part)),
        (None, None) => None,
    };
    Ok(page)
}

/// One page of the reasons stored in `keys`' keyspace, the shards shown at `base` + index.
async fn space_reasons<C: ConnectionLike + Send>(
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

/// A task's shards as cells, each a run of consecutive shards coloured by its worst member.
#[derive(Debug, Clone, Serialize)]
pub struct ShardMap {
    /// Shards of the task.
    pub total: u64,
    /// Shards per cell (the last cell may hold fewer).
    pub per_cell: u64,
    /// One letter per cell: `f` failed, `r` running, `y` retrying, `p` pending, `c` never to run
    /// (its task was cancelled), `d` done (the first of these its shards have, in this order).
    pub cells: String,
    /// Shards held by an executor now.
    pub running: u64,
    /// Shards not terminal with a failure reason stored (they run again).
    pub retrying: u64,
    /// Whether every failure reason was read; past [`MAX_REASONS`] failed shards without a
    /// reason read are drawn as done.
    pub reasons_complete: bool,
}

/// Bitmaps up to this many bytes are read (in [`BITMAP_CHUNK`]s) and counted here; larger ones
/// are counted by Redis, one `BITCOUNT` per cell.
const LOCAL_BITMAP_MAX: u64 = 8 << 20;

/// Reads the shard map of `t`. Its cost is bounded by the bitmap's bytes (only up to a pull
/// task's cursor: the rest was never claimed), the cells, the task's held refs and its reasons;
/// never a step per shard. At most `max_cells` (≤ [`MAX_CELLS`]) cells.
pub async fn shard_map<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Home,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    shares_map(con, keys, t, max_cells).await
}

/// The map of a task: each share's map, with cells in proportion to its size, one after the
/// other (the shares are contiguous ranges of the task; one share, the home record itself, for
/// a task of one partition).
async fn shares_map<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Home,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    let max_cells = max_cells.clamp(1, MAX_CELLS);
    let shares = shardctl_common::share::of(con, keys, t).await?;
    if let [one] = &shares[..] {
        // the whole task in one share: its own map, at its own cell size
        if let Some(mut r) = shardctl_common::share::record(con, one, t).await? {
            r.state = if t.state == shardctl_common::model::TaskState::Cancelled { t.state } else { r.state };
            return space_map(con, &one.keys, &r, max_cells).await;
        }
    }
    let mut out = ShardMap {
        total: t.total,
        per_cell: t.total.div_ceil(max_cells).max(1),
        cells: String::new(),
        running: 0,
        retrying: 0,
        reasons_complete: true,
    };
    for s in &shares {
        let cells = (max_cells * s.size).div_ceil(t.total.max(1)).max(1);
        let Some(mut share) = shardctl_common::share::record(con, s, t).await? else {
            // not there (cleaned) or another incarnation's: drawn as the home says
            let c = if t.state.is_finished() { 'd' } else { 'p' };
            out.cells.extend(std::iter::repeat_n(c, s.size.div_ceil(s.size.div_ceil(cells)) as usize));
            continue;
        };
        // a share of a cancelled task is cancelled too; one still running shows as it is
        share.state = if t.state == shardctl_common::model::TaskState::Cancelled { t.state } else { share.state };
        let m = space_map(con, &s.keys, &share, cells).await?;
        out.cells.push_str(&m.cells);
        out.running += m.running;
        out.retrying += m.retrying;
        out.reasons_complete &= m.reasons_complete;
    }
    Ok(out)
}

/// The map of a task (or a share) in one keyspace.
async fn space_map<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    let total = t.total;
    let mut per_cell = total.div_ceil(max_cells.clamp(1, MAX_CELLS)).max(1);
    // only a pull task's indexes below its cursor can be terminal
    let reached = if t.strategy == "pull" { t.cursor.min(total) } else { total };
    let local = reached.div_ceil(8) <= LOCAL_BITMAP_MAX;
    if !local {
        per_cell = per_cell.div_ceil(8) * 8; // cells of whole bytes, for BITCOUNT
    }
    let n = total.div_ceil(per_cell) as usize;
    let cell_of = |i: u64| (i / per_cell) as usize;
    let key = keys.terminal(&t.task_id);
    let mut terminal_in = vec![0u64; n];
    let mut bitmap: Vec<u8> = Vec::new();
    if local {
        let bytes = reached.div_ceil(8);
        let mut from = 0u64;
        while from < bytes {
            let to = (from + BITMAP_CHUNK).min(bytes) - 1;
            let part: Vec<u8> = redis::cmd("GETRANGE").arg(&key).arg(from).arg(to).query_async(con).await?;
            let short = (part.len() as u64) < to - from + 1;
            bitmap.extend_from_slice(&part);
            if short {
                break; // the rest is zeros: Redis returns only what the string holds
            }
            from = to + 1;
        }
        for (k, &b) in bitmap.iter().enumerate() {
            if b == 0 {
                continue;
            }
            let first = k as u64 * 8;
            let last = (first + 7).min(total.saturating_sub(1));
            if cell_of(first) == cell_of(last) {
                terminal_in[cell_of(first)] += u64::from(b.count_ones());
            } else {
                for bit in 0..8u64 {
                    if b & (0x80 >> bit) != 0 && first + bit < total {
                        terminal_in[cell_of(first + bit)] += 1;
                    }
                }
            }
        }
    } else {
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let mut pipe = redis::pipe();
            for &c in chunk {
                let (a, b) = (c as u64 * per_cell / 8, ((c as u64 + 1) * per_cell).min(total).div_ceil(8) - 1);
                pipe.cmd("BITCOUNT").arg(&key).arg(a).arg(b);
            }
            let counts: Vec<u64> = pipe.query_async(con).await?;
            for (&c, v) in chunk.iter().zip(counts) {
                terminal_in[c] = v;
            }
        }
    }
    // the shards held now: refs `<id>:<seq>:<index>` in `active` (bounded by what executors hold)
    let pattern = format!("{}:{}:*", t.task_id, t.seq);
    let mut running_in = vec![false; n];
    let mut running = 0u64;
    for field in hscan_fields(con, &keys.active(), Some(&pattern), usize::MAX).await?.0 {
        if let Some(i) = field.rsplit(':').next().and_then(|i| i.parse::<u64>().ok()).filter(|&i| i < total) {
            running_in[cell_of(i)] = true;
            running += 1;
        }
    }
    // the reasons' indexes (not their texts), and whether each is terminal (failed) or not
    let errors = keys.errors(&t.task_id);
    let count: u64 = redis::cmd("HLEN").arg(&errors).query_async(con).await?;
    let (names, reasons_complete) = if count as usize <= MAX_REASONS {
        (redis::cmd("HKEYS").arg(&errors).query_async::<Vec<String>>(con).await?, true)
    } else {
        hscan_fields(con, &errors, None, MAX_REASONS).await?
    };
    let indexes: Vec<u64> = names.iter().filter_map(|k| k.parse().ok()).filter(|&i| i < total).collect();
    let bits: Vec<bool> = if local {
        indexes.iter().map(|&i| bitmap.get((i / 8) as usize).is_some_and(|b| b & (0x80 >> (i % 8)) != 0)).collect()
    } else {
        let mut out = Vec::with_capacity(indexes.len());
        for chunk in indexes.chunks(10_000) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                pipe.cmd("GETBIT").arg(&key).arg(i);
            }
            let got: Vec<u8> = pipe.query_async(con).await?;
            out.extend(got.into_iter().map(|b| b == 1));
        }
        out
    };
    let (mut failed_in, mut retry_in) = (vec![false; n], vec![false; n]);
    let mut retrying = 0u64;
    for (&i, &terminal) in indexes.iter().zip(&bits) {
        if terminal {
            failed_in[cell_of(i)] = true;
        } else {
            retry_in[cell_of(i)] = true;
            retrying += 1;
        }
    }
    // a finished task's shards that are not terminal never run (it was cancelled)
    let ended = t.state.is_finished();
    let cells = (0..n)
        .map(|c| {
            let size = ((c as u64 + 1) * per_cell).min(total) - c as u64 * per_cell;
            if failed_in[c] {
                'f'
            } else if running_in[c] && !ended {
                'r'
            } else if retry_in[c] && !ended {
                'y'
            } else if terminal_in[c] < size {
                if ended {
                    'c'
                } else {
                    'p'
                }
            } else {
                'd'
            }
        })
        .collect();
    Ok(ShardMap { total, per_cell, cells, running, retrying: if ended { 0 } else { retrying }, reasons_complete })
}

/// The field names of a hash by `HSCAN`, matching `pattern` if given, at most about `cap`;
/// whether all were read.
async fn hscan_fields<C: ConnectionLike + Send>(
    con: &mut C,
    key: &str,
    pattern: Option<&str>,
    cap: usize,
) -> Result<(Vec<String>, bool)> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(key).arg(cursor).arg("COUNT").arg(1000);
        if let Some(p) = pattern {
            cmd.arg("MATCH").arg(p);
        }
        let (next, flat): (u64, Vec<String>) = cmd.query_async(con).await?;
        out.extend(flat.into_iter().step_by(2));
        if next == 0 {
            return Ok((out, true));
        }
        if out.len() >= cap {
            return Ok((out, false));
        }
        cursor = next;
    }
}
