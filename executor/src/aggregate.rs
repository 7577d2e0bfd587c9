//! Reads every shard's outcome of a finished task, in shard order, for its aggregator.

use std::collections::HashMap;

use serde_json::Value;
use shardctl_common::conn::Conn;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Keys, Result};

use crate::handler::ShardOutcome;

/// Scans a hash in chunks (a million entries must not block Redis in one reply).
async fn scan_hash(con: &mut Conn, key: &str) -> Result<HashMap<u64, String>> {
    let mut out = HashMap::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<(String, String)>) =
            redis::cmd("HSCAN").arg(key).arg(cursor).arg("COUNT").arg(10_000).query_async(con).await?;
        for (k, v) in page {
            if let Ok(i) = k.parse() {
                out.insert(i, v);
            }
        }
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// Every shard's outcome: its stored result (`null` when none was stored) or its failure. A
/// task spread over partitions (`parts`, the queue's partitions) has them in its shares, indexed
/// from each share's `base`.
pub(crate) async fn outcomes(
    con: &mut Conn,
    keys: &Keys,
    parts: &[Keys],
    task: &TaskInfo,
    token: &str,
) -> Result<Vec<ShardOutcome>> {
    let (mut results, mut errors) = (HashMap::new(), HashMap::new());
    if task.partitions <= 1 {
        results = scan_hash(con, &keys.results(&task.task_id)).await?;
        errors = scan_hash(con, &keys.errors(&task.task_id)).await?;
    } else {
        if parts.len() != task.partitions as usize {
            return Err(shardctl_common::Error::Protocol(format!(
                "task {} runs over {} partitions, this executor serves {}",
                task.task_id,
                task.partitions,
                parts.len()
            )));
        }
        for (p, pk) in parts.iter().enumerate() {
            // fewer shards than partitions: the last ones have no share
            if shardctl_common::partition::share_range(p as u32 + 1, task.partitions, task.total).1 == 0 {
                continue;
            }
            use shardctl_common::share::num;
            let share = shardctl_common::share::read(
                con,
                pk,
                &task.task_id,
                &task.inc,
                &["base", "total", "state", "done", "failed"],
            )
            .await?;
            let bits: u64 = redis::cmd("BITCOUNT").arg(pk.terminal(&task.task_id)).query_async(con).await?;
            // (another slot: a command of its own)
            let counted_home: Option<String> = redis::cmd("HGET")
                .arg(keys.task(&task.task_id))
                .arg(format!("part:{}", p + 1))
                .query_async(con)
                .await?;
            let ours = share.is_some();
            let v = share.unwrap_or_else(|| vec![None; 5]);
            let (base, total, state) = (num(&v[0]), v[1].as_deref().and_then(|t| t.parse::<u64>().ok()), v[2].clone());
            let (done, failed) = (num(&v[3]), num(&v[4]));
            // a share counted in the home whose partition lost writes since (a failover of its
            // master): running again (its lost shards run again), gone (the reconciliation
            // creates it again), or ended with other counts than the ones counted (it re-ended
            // meanwhile, or lost a retry: the reconciliation reports or retries it). Aggregating
            // now would miss results: its count is forgotten and the task runs until the share
            // is counted anew (this job is withdrawn)
            let running = matches!(state.as_deref(), Some("running" | "delayed"));
            let counted = format!("{done}/{failed}");
            // (a share's round may be older than the home's: a retry reruns only the shares with
            // failures; the counts tell a retry lost after its count)
            let ended = shardctl_common::share::ended(state.as_deref());
            let stale = ended && counted_home.as_deref() != Some(counted.as_str());
            if !ours || running || stale {
                let forgotten =
                    shardctl_common::scripts::uncount(con, keys, &task.task_id, &task.inc, p as u32 + 1, token).await?;
                let what = match (ours, running) {
                    (false, _) => "is gone",
                    (true, true) => "runs again",
                    (true, false) => "ended with other counts than its count",
                };
                tracing::warn!(task = %task.task_id, partition = p + 1, forgotten, "a counted share {what}: lost writes");
                return Err(shardctl_common::Error::Protocol(format!(
                    "task {}: share {} {what} after it was counted (its partition's master lost writes){}",
                    task.task_id,
                    p + 1,
                    if forgotten {
                        ": its count is forgotten; the aggregation runs once it is counted again"
                    } else {
                        ""
                    }
                )));
            }
            if !ended || total != Some(bits) {
                return Err(shardctl_common::Error::Protocol(format!(
                    "task {}: share {} is not complete ({bits} of {} shards terminal, {})",
                    task.task_id,
                    p + 1,
                    total.unwrap_or(0),
                    state.unwrap_or_default()
                )));
            }
            results.extend(scan_hash(con, &pk.results(&task.task_id)).await?.into_iter().map(|(i, v)| (base + i, v)));
            errors.extend(scan_hash(con, &pk.errors(&task.task_id)).await?.into_iter().map(|(i, v)| (base + i, v)));
        }
    }
    Ok((0..task.total)
        .map(|index| {
            let result = match (results.get(&index), errors.get(&index)) {
                (_, Some(e)) => Err(e.clone()),
                (Some(r), None) => Ok(serde_json::from_str(r).unwrap_or_else(|_| Value::String(r.clone()))),
                (None, None) => Ok(Value::Null),
            };
            ShardOutcome { index, result }
        })
        .collect())
}
