//! Reads every shard's outcome of a finished task, in shard order, for its aggregator.

use std::collections::HashMap;

use serde_json::Value;
use shardctl_common::conn::Conn;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Home, Result};

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

/// Every ended shard's outcome: its stored result (`null` when none was stored) or its failure, read
/// from each of the task's shares (`shardctl_common::share`) at its base, once the share is
/// checked: a share that lost writes after its count (a failover of its partition's master)
/// makes its count forgotten (`uncount.lua`, for the holder of the aggregation's claim `token`)
/// and the aggregation fail, to run again once the share is counted anew. Also the shards
/// cancelled when the task met its `success_when`, which have no outcome.
pub(crate) async fn outcomes(
    con: &mut Conn,
    home: &Home,
    task: &TaskInfo,
    token: &str,
) -> Result<(Vec<ShardOutcome>, Vec<u64>)> {
    use shardctl_common::share::{check_counted, Counted};
    let (mut results, mut errors) = (HashMap::new(), HashMap::new());
    let shares = shardctl_common::share::of(con, home, task).await?;
    let mut ended: Option<Vec<bool>> = task.cancelled.map(|_| vec![false; task.total as usize]);
    // checked before the read and again after it: a share that lost writes while its results
    // were read (a failover of its partition's master) is caught by the second check, so a read
    // that missed results is never aggregated (writes replicate in order: a share sound after
    // the read was whole during it)
    for (pass, s) in shares.iter().map(|s| (0, s)).chain(shares.iter().map(|s| (1, s))) {
        match check_counted(con, home, task, s).await? {
            Counted::Sound => {}
            Counted::Lost(what) => {
                let forgotten =
                    shardctl_common::scripts::uncount(con, home, &task.task_id, &task.inc, s.partition, token).await?;
                tracing::warn!(task = %task.task_id, partition = s.partition, forgotten, "a counted share {what}: lost writes");
                return Err(shardctl_common::Error::Protocol(format!(
                    "task {}: share {} {what} after it was counted (its partition's master lost writes){}",
                    task.task_id,
                    s.partition,
                    if forgotten {
                        ": its count is forgotten; the aggregation runs once it is counted again"
                    } else {
                        ""
                    }
                )));
            }
            Counted::Cancelled => {
                // the home lost the cancel its shares kept: cancelled again, the job with it
                shardctl_common::control::cancel(con, home, &task.task_id).await?;
                tracing::warn!(task = %task.task_id, partition = s.partition, "a share was cancelled, its home had lost the cancel: the task is cancelled again");
                return Err(shardctl_common::Error::Protocol(format!(
                    "task {}: share {} was cancelled (its home lost the cancel in a failover): the task is cancelled again",
                    task.task_id, s.partition
                )));
            }
            Counted::Incomplete(why) => {
                return Err(shardctl_common::Error::Protocol(format!(
                    "task {}: share {} is not complete ({why})",
                    task.task_id, s.partition
                )));
            }
        }
        if pass == 1 {
            continue;
        }
        // a task that met its `success_when` (k-of-n: docs/design/failure-policies.md) aggregates
        // the shards that ended, their terminal bits (read between the two checks); the others
        // were cancelled
        if let Some(ended) = ended.as_mut() {
            let bits: Vec<u8> = redis::cmd("GET")
                .arg(s.keys.terminal(&task.task_id))
                .query_async::<Option<Vec<u8>>>(con)
                .await?
                .unwrap_or_default();
            for i in 0..s.size {
                if bits.get((i / 8) as usize).is_some_and(|byte| byte & (0x80 >> (i % 8)) != 0) {
                    if let Some(e) = ended.get_mut((s.base + i) as usize) {
                        *e = true;
                    }
                }
            }
        }
        let at = |m: HashMap<u64, String>| m.into_iter().filter(|(i, _)| *i < s.size).map(|(i, v)| (s.base + i, v));
        results.extend(at(scan_hash(con, &s.keys.results(&task.task_id)).await?));
        errors.extend(at(scan_hash(con, &s.keys.errors(&task.task_id)).await?));
    }
    let is_ended = |i: u64| ended.as_ref().is_none_or(|e| e.get(i as usize).copied().unwrap_or(false));
    let (mut out, mut cancelled) = (Vec::new(), Vec::new());
    for index in 0..task.total {
        if !is_ended(index) {
            cancelled.push(index);
            continue;
        }
        let result = match (results.get(&index), errors.get(&index)) {
            (_, Some(e)) => Err(e.clone()),
            (Some(r), None) => Ok(serde_json::from_str(r).unwrap_or_else(|_| Value::String(r.clone()))),
            (None, None) => Ok(Value::Null),
        };
        out.push(ShardOutcome { index, result });
    }
    Ok((out, cancelled))
}
