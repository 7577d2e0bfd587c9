//! The runtime's confirmations (`docs/design/durability.md`), made on the connection of its
//! `durability::Waiter`, so that a wait never holds up claims and heartbeats: its recorded
//! completions before they count, and an aggregation job's claim before the aggregator starts.

use std::collections::BTreeMap;
use std::time::Duration;

use shardctl_common::model::{Job, ShardRef};
use tokio_util::sync::CancellationToken;

use crate::handler::ShardError;
use crate::shared::Shared;

/// What a confirmation found of one recorded completion (or aggregation failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is durable (or nothing is waited for).
    Durable,
    /// A failover took it: record it again.
    Lost,
    /// Its task is gone, or is another incarnation now: nothing is left to confirm.
    Gone,
}

/// Whether the queue's durability asks recorded completions to be confirmed: true while it is
/// unknown (a completion is kept rather than forgotten on a guess).
pub(crate) async fn waits(shared: &Shared) -> bool {
    shared.durable.now(&shared.con).await.is_none_or(|d| d.waits())
}

/// One outcome of a task in a confirmation: its place in the refs, and its shard's index (`None`:
/// the aggregation job).
type Item = (usize, Option<u64>);

/// Confirms recorded outcomes (`refs`, every one counted by its call: completions, and
/// aggregation jobs failed for good) in one pipeline: a shard must show its terminal bit in its
/// task's incarnation; the aggregation job, its task ended. `None` while the wait times out (or
/// Redis fails): confirm again.
pub(crate) async fn completions(shared: &Shared, refs: &[&ShardRef]) -> Option<Vec<Verdict>> {
    let d = shared.durable.now(&shared.con).await?;
    if !d.waits() || refs.is_empty() {
        return Some(vec![Verdict::Durable; refs.len()]);
    }
    // per task and incarnation: its shards' indexes (each with its place in `refs`)
    let mut tasks: BTreeMap<(&str, u64), Vec<Item>> = BTreeMap::new();
    for (n, r) in refs.iter().enumerate() {
        let index = match r.job {
            Job::Shard(i) => Some(i),
            Job::Aggregate => None,
        };
        tasks.entry((r.task.as_str(), r.seq)).or_default().push((n, index));
    }
    let keys = &shared.keys;
    let mut reads = redis::pipe();
    for ((task, _), items) in &tasks {
        reads.cmd("HMGET").arg(keys.task(task)).arg(&["seq", "state"]);
        let mut bits = redis::cmd("BITFIELD");
        bits.arg(keys.terminal(task));
        for i in items.iter().filter_map(|(_, i)| *i) {
            bits.arg("GET").arg("u1").arg(i);
        }
        // (a BITFIELD with no GET answers an empty array)
        reads.add_command(bits);
    }
    let confirmed = match shared.durable.confirm(&shared.con, keys, &d, &reads).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("confirming {} completions: {e}", refs.len());
            return None;
        }
    };
    shared.metrics.durability_confirmations.increment(1);
    if !confirmed.durable {
        shared.metrics.durability_timeouts.increment(1);
        return None;
    }
    let mut out = vec![Verdict::Lost; refs.len()];
    for (((_, seq), items), pair) in tasks.iter().zip(confirmed.reads.chunks(2)) {
        let (stored_seq, state): (Option<u64>, Option<String>) =
            pair.first().and_then(|v| redis::from_redis_value(v.clone()).ok()).unwrap_or((None, None));
        let bits: Vec<u8> = pair.get(1).and_then(|v| redis::from_redis_value(v.clone()).ok()).unwrap_or_default();
        let ended = matches!(state.as_deref(), Some("completed" | "failed"));
        let mut bit = bits.iter();
        for (n, index) in items {
            out[*n] = match (stored_seq == Some(*seq), index) {
                // removed since, or another incarnation under the id: a resend would be refused
                (false, Some(_)) => {
                    bit.next();
                    Verdict::Gone
                }
                (false, None) => Verdict::Gone,
                (true, Some(_)) if bit.next() == Some(&1) => Verdict::Durable,
                (true, None) if ended => Verdict::Durable,
                _ => Verdict::Lost,
            };
        }
    }
    Some(out)
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
