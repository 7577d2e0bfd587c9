//! A task's shard map for the dashboard: its shards as cells, each a run of consecutive shards
//! coloured by its worst member. The read costs the bitmap's bytes, the cells, the task's held
//! refs and its reasons, never a step per shard (docs/design/dashboard.md).

use redis::aio::ConnectionLike;
use serde::Serialize;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Home, Keys, Result};

/// Most cells of a shard map.
pub const MAX_CELLS: u64 = 20_000;
/// Bytes of the terminal bitmap read per `GETRANGE`.
const BITMAP_CHUNK: u64 = 64 * 1024;
/// Most failure reasons whose indexes a shard map reads (their texts are never read); past
/// them it says its failures are incomplete.
pub const MAX_REASONS: usize = 1_000_000;

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
    home: &Home,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    shares_map(con, home, t, max_cells).await
}

/// The map of a task: each share's map, with cells in proportion to its size, one after the
/// other (the shares are contiguous ranges of the task; one share, the home record itself, for
/// a task of one partition).
async fn shares_map<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    t: &TaskInfo,
    max_cells: u64,
) -> Result<ShardMap> {
    let max_cells = max_cells.clamp(1, MAX_CELLS);
    let shares = shardctl_common::share::of(con, home, t).await?;
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
