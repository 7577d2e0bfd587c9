//! Retrying a task: its failed shards (or its failed aggregation) run again, over each of its
//! partitions with the home's new round, so that no share is retried twice in one round.

use redis::aio::ConnectionLike;

use crate::error::{refused, Error, Result};
use crate::home::Home;
use crate::keys::Keys;
use crate::partition::layout::{task_layout, Layout};
use crate::scripts::{scripts, KeyArgs};
use crate::share::{home_inc_of, share_inc};

/// Runs the failed shards of task `id` again (or its failed aggregation); aggregation follows
/// once every shard is terminal. Returns how many shards go again (1 for an aggregation alone);
/// 0 when nothing had failed.
pub async fn retry<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<u64> {
    crate::names::validate_task_id(id)?;
    retry_over(con, home, id).await
}

/// `retry.lua` on task `id` of one keyspace.
pub(crate) async fn retry_here<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<u64> {
    retry_in_round(con, keys, id, None).await
}

/// `retry.lua` on task `id` of one keyspace; a share of a partitioned task with the home's new
/// `round` (the share takes it in the same call, and is not retried twice in one round).
pub async fn retry_in_round<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    id: &str,
    round: Option<u64>,
) -> Result<u64> {
    let mut inv = scripts().retry.keyed(keys, &KeyArgs { task: Some(id), ..Default::default() });
    inv.arg(keys.prefix()).arg(id);
    if let Some(r) = round {
        inv.arg(r);
    }
    let code: i64 = inv.invoke_async(con).await?;
    if code < 0 {
        return Err(refused(id, code, "retry"));
    }
    Ok(code as u64)
}

/// Runs the failed shards of task `id` over partitions again (`shardctl retry`), ended or still
/// running: the home record is reopened (`reopen.lua`: a new round, the counts of the shares
/// with failures forgotten), then every share not counted is retried in its partition
/// (`retry.lua`) in the new round. A task whose shards all succeeded but whose aggregation
/// failed retries its aggregation alone, in the home. On a running task without failures it
/// completes a retry cut short (see [`resume_retries`]). Returns how many shards (or 1: the
/// aggregation) run again.
async fn retry_over<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<u64> {
    let layout = task_layout(con, home, id).await?;
    if !layout.partitioned() {
        // the home record is its one share: `retry.lua` on it
        return retry_here(con, home, id).await;
    }
    let mut fields: Vec<String> = ["state", "round", "halted", "cancelled"].map(str::to_owned).to_vec();
    fields.extend((1..=layout.count()).map(|p| format!("part:{p}")));
    let row: Vec<Option<String>> = redis::cmd("HMGET").arg(home.task(id)).arg(&fields).query_async(con).await?;
    let (state, halted, settled) = (row[0].clone(), row[2].is_some(), row[3].is_some());
    // a share's count is `<done>/<failed>[/<cancelled>]`
    let failed_parts: Vec<u32> = (1..=layout.count())
        .filter(|p| {
            row[3 + *p as usize]
                .as_deref()
                .and_then(|v| v.split('/').nth(1))
                .is_some_and(|f| f.parse::<u64>().is_ok_and(|f| f > 0))
        })
        .collect();
    match state.as_deref() {
        // settled (k-of-n): refused, or its failed aggregation alone runs again, as in one slot
        Some("running" | "completed" | "failed" | "aggregating") if settled => retry_here(con, home, id).await,
        // halted (failed fast): its shares run their failed and unfinished shards again
        Some("failed") if halted => reopen_and_retry(con, &layout, id).await,
        Some("running") => {
            let round = row[1].as_deref().and_then(|r| r.parse().ok()).unwrap_or(0);
            let counted: Vec<bool> = (1..=layout.count()).map(|p| row[3 + p as usize].is_some()).collect();
            if failed_parts.is_empty() && !uncounted_failures(con, &layout, id, &counted).await? {
                return resume_retries(con, &layout, id, round).await;
            }
            reopen_and_retry(con, &layout, id).await
        }
        Some("completed" | "failed" | "aggregating") if !failed_parts.is_empty() => {
            reopen_and_retry(con, &layout, id).await
        }
        // only the aggregation failed (or nothing did), a cancelled or missing task: as for any task
        _ => retry_here(con, home, id).await,
    }
}

/// Whether a share of task `id` not counted in the home yet (`counted[p - 1]` false) has shards
/// failed for good in its partition.
async fn uncounted_failures<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    counted: &[bool],
) -> Result<bool> {
    let inc = home_inc_of(con, &layout.home, id).await?;
    for (pk, counted) in layout.partitions.iter().zip(counted) {
        if *counted {
            continue;
        }
        let failed: Option<u64> = redis::cmd("HGET").arg(pk.task(id)).arg("failed").query_async(con).await?;
        if inc.is_some() && share_inc(con, pk, id).await? == inc && failed.is_some_and(|f| f > 0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Retries the failed shards of task `id`: the home is reopened in a new round, the counts of
/// the shares counted with failures forgotten (`reopen.lua` chooses them, atomically with the
/// counts), then every share not counted in the home takes the new round, running its failed
/// shards again (one with none only takes the round: its count, when it ends, is reported in
/// it). Nothing happens when the task is no longer running and no counted share has failures
/// (another retry came first).
async fn reopen_and_retry<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, id: &str) -> Result<u64> {
    let round = crate::scripts::reopen(con, &layout.home, id, None, &[]).await?;
    if round < 0 {
        return Err(refused(id, round, "retry"));
    }
    if round == 0 {
        return Ok(0);
    }
    let mut again = 0;
    for (pk, counted) in layout.partitions.iter().zip(counted(con, layout, id).await?) {
        if !counted {
            again += retry_share(con, pk, id, round as u64).await?;
        }
    }
    Ok(again)
}

/// Per partition of task `id`'s layout, whether its share is counted in the home (one read).
async fn counted<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, id: &str) -> Result<Vec<bool>> {
    let fields: Vec<String> = (1..=layout.count()).map(|p| format!("part:{p}")).collect();
    let v: Vec<Option<String>> = redis::cmd("HMGET").arg(layout.home.task(id)).arg(&fields).query_async(con).await?;
    Ok(v.iter().map(Option::is_some).collect())
}

/// Retries the share of task `id` in partition `part` in home round `round`.
async fn retry_share<C: ConnectionLike + Send>(con: &mut C, partition: &Keys, id: &str, round: u64) -> Result<u64> {
    match retry_in_round(con, partition, id, Some(round)).await {
        Ok(n) => Ok(n),
        // gone, or cancelled meanwhile: nothing runs again there
        Err(Error::Refused { .. } | Error::NoTask(_)) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Completes a retry cut short after its home record was reopened: every share of task `id`
/// that ended in a round older than the home's `round`, its count missing in the home, is
/// retried in that round. Returns how many shards run again.
pub async fn resume_retries<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    round: u64,
) -> Result<u64> {
    let inc = home_inc_of(con, &layout.home, id).await?;
    let mut again = 0;
    for (pk, counted) in layout.partitions.iter().zip(counted(con, layout, id).await?) {
        if counted {
            continue;
        }
        let (state, share_round): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(pk.task(id)).arg("state").arg("round").query_async(con).await?;
        if crate::share::ended(state.as_deref())
            && share_round.is_some_and(|r| r < round)
            && inc.is_some()
            && share_inc(con, pk, id).await? == inc
        {
            again += retry_share(con, pk, id, round).await?;
        }
    }
    Ok(again)
}
