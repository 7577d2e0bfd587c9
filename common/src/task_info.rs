//! What a task hash holds, read back ([`TaskInfo`]), and what makes a record a share of a
//! partitioned task ([`Share`]); re-exported by `model`.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::Error;
use crate::ring::DEFAULT_VNODES;
use crate::task_state::TaskState;

/// A task as read back from its hash.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    /// Task id.
    pub task_id: String,
    /// Its incarnation: the queue's submission number when this task under this id was
    /// dispatched (refs carry it, see [`ShardRef`](crate::shard_ref::ShardRef)).
    pub seq: u64,
    /// Its incarnation id across slots, `<seq>.<nonce>` (never reissued after a failover, see
    /// [`crate::incarnation`]); what a share names its home by.
    pub inc: String,
    /// Handler kind.
    pub kind: String,
    /// Lifecycle state.
    pub state: TaskState,
    /// Number of shards.
    pub total: u64,
    /// Items over all shards.
    pub items: u64,
    /// Shards completed.
    pub done: u64,
    /// Shards failed for good.
    pub failed: u64,
    /// Shards handed out from the cursor so far.
    pub cursor: u64,
    /// Attempts per shard.
    pub attempts: u32,
    /// Retry backoff.
    pub backoff: String,
    /// Placement strategy.
    pub strategy: String,
    /// Its weight among the tasks of its priority and group (docs/design/fairness.md).
    pub weight: u32,
    /// Its group, if it names one.
    pub group: Option<String>,
    /// Its cap on shards held at once, if any.
    pub max_running: Option<u64>,
    /// Its shards held now (running, or claimed to start next) over its shares, when read
    /// (`held`, docs/design/fairness.md): `status` and the dashboard read it for a running task.
    pub running: Option<u64>,
    /// Once more shards than this failed for good the task fails at once (`--max-failures`,
    /// docs/design/failure-policies.md), if it has such a limit.
    pub max_failures: Option<u64>,
    /// Once this many shards completed, the others are cancelled (`--success-when`, absolute).
    pub success_when: Option<u64>,
    /// At most this many backup attempts for straggling shards (`--speculate`,
    /// docs/design/speculation.md); `None`: none.
    pub speculate: Option<u64>,
    /// Backup attempts started, and those that finished first.
    pub spec_started: u64,
    /// Backup attempts that finished first.
    pub spec_won: u64,
    /// Shards cancelled when the task met its `success_when` (never counted as done).
    pub cancelled: Option<u64>,
    /// Why the task ended early, failed (a fail-fast or a handler's `fail_task`), if it did.
    pub halted: Option<String>,
    /// The first shard that failed for good, `<index> <reason>` (its reason's last line, cut).
    pub first_failure: Option<String>,
    /// Shards placed so far (routed tasks).
    pub routed: Option<u64>,
    /// Virtual nodes per executor (consistent hash).
    #[serde(skip)]
    pub vnodes: u32,
    /// Shard keys are stored, not derived from the index.
    #[serde(skip)]
    pub has_keys: bool,
    /// Longest an attempt may run, in ms (0: no limit).
    pub shard_timeout_ms: u64,
    /// Start time of a delayed task, ms since the epoch.
    pub start_ms: Option<u64>,
    /// Per-shard results stay after the aggregation.
    pub keep_results: bool,
    /// How long its keys stay once it ended, in ms (0: until cleaned).
    pub retain_ms: u64,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// End time, when finished.
    pub finished_ms: Option<u64>,
    /// Time of the last `retry`, if any: the time a run took counts from it.
    pub retried_ms: Option<u64>,
    /// Partitions its shards are spread over (1: not partitioned).
    pub partitions: u32,
    /// Set when this record is one partition's share of a partitioned task, not a task.
    #[serde(skip)]
    pub share: Option<Share>,
    /// The aggregation's result.
    pub result: Option<serde_json::Value>,
    /// Why the aggregation failed, if it did.
    pub aggregation_error: Option<String>,
    /// Its shards' run times, once one was timed (docs/design/dashboard.md, "Where time goes").
    pub durations: Option<crate::durations::Summary>,
    /// The histogram they are read from (over partitions, summed over the shares).
    #[serde(skip)]
    pub histogram: crate::durations::Histogram,
    /// Its completions over time, once one was counted (over partitions, summed).
    pub throughput: Option<crate::throughput::Series>,
    /// The task payload.
    #[serde(skip)]
    pub payload: String,
}

/// What makes a task record one partition's share of a partitioned task
/// (docs/design/partitions.md): its shards are the task's `base .. base + total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The partition, 1..=K.
    pub partition: u32,
    /// The task's index of the share's shard 0.
    pub base: u64,
    /// The task's total (the share's own `total` is its size).
    pub of: u64,
    /// The home record's incarnation id (its `inc`).
    pub home_inc: String,
    /// The home's retry round it runs in.
    pub round: u64,
}

impl TaskInfo {
    /// Builds the info from a task hash (`HGETALL`); `None` when the hash is empty.
    pub fn from_hash(task_id: &str, h: &HashMap<String, String>) -> Result<Option<Self>, Error> {
        if h.is_empty() {
            return Ok(None);
        }
        let num = |f: &str| -> Result<u64, Error> {
            h.get(f)
                .map(|v| v.parse::<u64>())
                .transpose()
                .map_err(|_| Error::Protocol(format!("task {task_id}: field {f} is not a number")))
                .map(|v| v.unwrap_or(0))
        };
        let result = h.get("result").map(|r| serde_json::from_str(r).unwrap_or(serde_json::Value::String(r.clone())));
        let histogram = crate::durations::Histogram::from_hash(h);
        Ok(Some(TaskInfo {
            task_id: task_id.to_owned(),
            seq: num("seq")?,
            inc: crate::incarnation::of_fields(h.get("inc").map(String::as_str), Some(num("seq")?)).unwrap_or_default(),
            kind: h.get("kind").cloned().unwrap_or_default(),
            state: h.get("state").map(|s| s.parse()).transpose()?.unwrap_or(TaskState::Running),
            total: num("total")?,
            items: num("items")?,
            done: num("done")?,
            failed: num("failed")?,
            cursor: num("cursor")?,
            attempts: num("attempts")? as u32,
            backoff: h.get("backoff").cloned().unwrap_or_default(),
            strategy: h.get("strategy").cloned().unwrap_or_else(|| "pull".into()),
            weight: h.get("weight").and_then(|v| v.parse().ok()).unwrap_or(1),
            group: h.get("group").cloned(),
            max_running: h.get("max_running").and_then(|v| v.parse().ok()),
            running: None,
            max_failures: h.get("max_failures").and_then(|v| v.parse().ok()),
            halted: h.get("halted").cloned(),
            success_when: h.get("success_when").and_then(|v| v.parse().ok()),
            speculate: h.get("speculate").and_then(|v| v.parse().ok()),
            spec_started: h.get("spec_started").and_then(|v| v.parse().ok()).unwrap_or(0),
            spec_won: h.get("spec_won").and_then(|v| v.parse().ok()).unwrap_or(0),
            cancelled: h.get("cancelled").and_then(|v| v.parse().ok()),
            first_failure: h.get("first_failure").cloned(),
            routed: h.get("routed").and_then(|v| v.parse().ok()),
            vnodes: h.get("vnodes").and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_VNODES),
            has_keys: h.get("has_keys").is_some_and(|v| v == "1"),
            shard_timeout_ms: h.get("shard_timeout_ms").and_then(|v| v.parse().ok()).unwrap_or(0),
            start_ms: h.get("start_ms").and_then(|v| v.parse().ok()),
            keep_results: h.get("keep_results").is_none_or(|v| v != "0"),
            retain_ms: h.get("retain_ms").and_then(|v| v.parse().ok()).unwrap_or(0),
            created_ms: num("created_ms")?,
            finished_ms: h.get("finished_ms").and_then(|v| v.parse().ok()),
            retried_ms: h.get("retried_ms").and_then(|v| v.parse().ok()),
            partitions: h.get("partitions").and_then(|v| v.parse().ok()).unwrap_or(1),
            share: match h.get("part") {
                None => None,
                Some(_) => Some(Share {
                    partition: num("part")? as u32,
                    base: num("base")?,
                    of: num("of")?,
                    home_inc: crate::incarnation::of_fields(
                        h.get("home_inc").map(String::as_str),
                        h.get("home_seq").and_then(|v| v.parse().ok()),
                    )
                    .unwrap_or_default(),
                    round: num("round")?,
                }),
            },
            result,
            aggregation_error: h.get("agg_error").cloned(),
            durations: histogram.summary(),
            histogram,
            throughput: crate::throughput::Series::from_hash(h),
            payload: h.get("payload").cloned().unwrap_or_else(|| "null".into()),
        }))
    }
}
