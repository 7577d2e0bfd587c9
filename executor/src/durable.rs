//! The runtime's confirmations (`docs/design/durability.md`), made on the connection of its
//! `durability::Waiter`, so that a wait never holds up claims and heartbeats: its recorded
//! completions before they count, and an aggregation job's claim before the aggregator starts.

use std::collections::BTreeMap;
use std::time::Duration;

use shardctl_common::model::{Job, ShardRef};
use shardctl_common::scripts::Finished;
use tokio_util::sync::CancellationToken;

use crate::handler::ShardError;
use crate::shared::Shared;

/// What a confirmation of recorded completions found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completions {
    /// Every one is durable (or nothing is waited for).
    Durable,
    /// A write the confirmation read was lost (a failover): record them again.
    Lost,
    /// The wait timed out (or Redis failed): confirm again.
    Pending,
}

/// Whether the queue's durability asks recorded completions to be confirmed: true while it is
/// unknown (a completion is kept rather than forgotten on a guess).
pub(crate) async fn waits(shared: &Shared) -> bool {
    shared.durable.now(&shared.con).await.is_none_or(|d| d.waits())
}

/// Confirms recorded completions (`finished`, every one counted by its call): each must show its
/// shard terminal in its task's incarnation; the aggregation job, its task ended.
pub(crate) async fn completions(shared: &Shared, finished: &[Finished<'_>]) -> Completions {
    let Some(d) = shared.durable.now(&shared.con).await else { return Completions::Pending };
    if !d.waits() || finished.is_empty() {
        return Completions::Durable;
    }
    // per task and incarnation: its shards' indexes, and whether its aggregation job is among them
    let mut tasks: BTreeMap<(&str, u64), (Vec<u64>, bool)> = BTreeMap::new();
    for f in finished {
        let r = &f.claim.shard_ref;
        let entry = tasks.entry((r.task.as_str(), r.seq)).or_default();
        match r.job {
            Job::Shard(i) => entry.0.push(i),
            Job::Aggregate => entry.1 = true,
        }
    }
    let keys = &shared.keys;
    let mut reads = redis::pipe();
    for ((task, _), (indexes, _)) in &tasks {
        reads.cmd("HMGET").arg(keys.task(task)).arg(&["seq", "state"]);
        let mut bits = redis::cmd("BITFIELD");
        bits.arg(keys.terminal(task));
        for i in indexes {
            bits.arg("GET").arg("u1").arg(*i);
        }
        // (a BITFIELD with no GET answers an empty array)
        reads.add_command(bits);
    }
    let confirmed = shared.durable.confirm(&shared.con, keys, &d, &reads).await;
    let confirmed = match confirmed {
        Ok(s) if s.durable => {
            shared.metrics.durability_confirmations.increment(1);
            s
        }
        Ok(_) => {
            shared.metrics.durability_confirmations.increment(1);
            shared.metrics.durability_timeouts.increment(1);
            return Completions::Pending;
        }
        Err(e) => {
            tracing::warn!("confirming {} completions: {e}", finished.len());
            return Completions::Pending;
        }
    };
    for (((_, seq), (indexes, agg)), pair) in tasks.iter().zip(confirmed.reads.chunks(2)) {
        let (Some(fields), Some(bits)) = (pair.first(), pair.get(1)) else { return Completions::Lost };
        let (stored_seq, state): (Option<u64>, Option<String>) =
            redis::from_redis_value(fields.clone()).unwrap_or((None, None));
        let bits: Vec<u8> = redis::from_redis_value(bits.clone()).unwrap_or_default();
        // a task gone (a failover back to before its dispatch, or removed since): recorded
        // again, a completion finds it so (`TaskMissing`)
        if stored_seq != Some(*seq) || bits.len() != indexes.len() || bits.iter().any(|b| *b != 1) {
            return Completions::Lost;
        }
        if *agg && !matches!(state.as_deref(), Some("completed" | "failed")) {
            return Completions::Lost;
        }
    }
    Completions::Durable
}

/// Waits until the aggregation job's claim is durable: `Ok` when a confirmation shows `active`
/// holding it under `token`; an error when it shows another holder or none (the claim was lost:
/// the aggregator must not run here), or when `cancel` fires. A wait that times out is repeated;
/// the job's lock is renewed meanwhile by the heartbeat.
pub(crate) async fn aggregation_claim(
    shared: &Shared,
    shard_ref: &ShardRef,
    token: &str,
    cancel: &CancellationToken,
) -> Result<(), ShardError> {
    loop {
        let confirmed = async {
            let Some(d) = shared.durable.now(&shared.con).await else {
                return Ok(None);
            };
            if !d.waits() {
                return Ok(Some(None));
            }
            let mut reads = redis::pipe();
            reads.cmd("HGET").arg(shared.keys.active()).arg(shard_ref.to_string());
            let s = shared.durable.confirm(&shared.con, &shared.keys, &d, &reads).await?;
            shared.metrics.durability_confirmations.increment(1);
            if !s.durable {
                shared.metrics.durability_timeouts.increment(1);
            }
            Ok::<_, shardctl_common::Error>(Some(Some(s)))
        };
        let retry = match confirmed.await {
            Ok(Some(None)) => return Ok(()),
            Ok(Some(Some(s))) if s.durable => {
                let holder: Option<String> = s.read(0).unwrap_or(None);
                return match holder.as_deref() {
                    Some(t) if t == token => Ok(()),
                    _ => Err(ShardError::new(
                        "the aggregation's claim is no longer this executor's (lost in a failover, or its task \
                         was cancelled or retried): not run here",
                    )),
                };
            }
            Ok(_) => Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(job = %shard_ref, "confirming the aggregation's claim: {e}");
                Duration::from_millis(500)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = cancel.cancelled() => return Err(ShardError::new("cancelled")),
        }
    }
}
