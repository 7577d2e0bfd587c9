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

/// Every shard's outcome: its stored result (`null` when none was stored) or its failure.
pub(crate) async fn outcomes(con: &mut Conn, keys: &Keys, task: &TaskInfo) -> Result<Vec<ShardOutcome>> {
    let results = scan_hash(con, &keys.results(&task.task_id)).await?;
    let errors = scan_hash(con, &keys.errors(&task.task_id)).await?;
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
