//! The confirmer (docs/design/durability.md): recorded completions the reporter holds for a
//! replica's confirmation arrive here, and every one waiting is confirmed in one pipeline (one
//! `WAIT`), however many batches they came in: a `WAIT` blocks its connection, so
//! confirmations made one per batch would bound the executor's throughput by their latency.
//! Durable, they count and their shards are forgotten; lost in a failover, they are recorded
//! again; while the wait times out, they wait, and more join them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use shardctl_common::model::ShardRef;

use crate::durable::Verdict;
use crate::outcome::Report;
use crate::report::{count, forget, outcomes, record};
use crate::shared::Shared;

/// Pause after a confirmation whose wait timed out (it waited the queue's timeout already).
const AGAIN: Duration = Duration::from_millis(100);

/// Confirms what arrives on `arriving` until the reporter is gone (the channel closed) and nothing
/// waits. At shutdown (`closing`), it gives up after the grace time: the lease ends with the
/// executor, and the sweep gives those shards to another, which runs them again.
pub(crate) async fn run(shared: Arc<Shared>, mut arriving: UnboundedReceiver<Vec<Report>>, closing: CancellationToken) {
    let mut held: Vec<Report> = Vec::new();
    let mut closing_since: Option<std::time::Instant> = None;
    loop {
        if held.is_empty() {
            match arriving.recv().await {
                Some(batch) => held.extend(batch),
                None => return,
            }
        }
        while let Ok(batch) = arriving.try_recv() {
            held.extend(batch);
        }
        let refs: Vec<&ShardRef> = held.iter().map(|r| &r.claim.shard_ref).collect();
        let Some(verdicts) = crate::durable::completions(&shared, &refs).await else {
            drop(refs);
            if give_up(&shared, &closing, &mut closing_since, &mut held, &mut arriving).await {
                return;
            }
            tokio::time::sleep(AGAIN).await;
            continue;
        };
        drop(refs);
        let (mut lost, mut durable, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for (r, v) in std::mem::take(&mut held).into_iter().zip(verdicts) {
            match v {
                Verdict::Lost => lost.push(r),
                Verdict::Durable => durable.push(r),
                Verdict::Gone => gone.push(r),
            }
        }
        // durable: counted now; gone (the task removed, or another incarnation): nothing to count
        let finished = outcomes(&durable);
        count(&shared, &finished, &vec![Ok(1); finished.len()]);
        drop(finished);
        shared.confirming.fetch_sub(durable.len() + gone.len(), Ordering::SeqCst);
        forget(&shared, durable);
        forget(&shared, gone);
        if lost.is_empty() {
            continue;
        }
        // what the calls had recorded is gone: record it again (a completion one did keep is
        // refused, then found recorded, as after a lost reply)
        tracing::warn!("{} completions were lost (a failover): recording them again", lost.len());
        shared.metrics.durability_lost.increment(lost.len() as u64);
        for r in &mut lost {
            r.sent = true;
        }
        let again = record(&shared, &lost, &closing).await;
        let (still, done): (Vec<_>, Vec<_>) = lost.into_iter().zip(again).partition(|(_, s)| *s);
        shared.confirming.fetch_sub(done.len(), Ordering::SeqCst);
        forget(&shared, done.into_iter().map(|(r, _)| r).collect());
        held = still.into_iter().map(|(r, _)| r).collect();
    }
}

/// At shutdown, gives up once the grace time has passed: the lease ends with the executor, and
/// the sweep gives the shards to another, which runs them again. True when it gave up (what
/// still arrives is given up the same way).
async fn give_up(
    shared: &Shared,
    closing: &CancellationToken,
    since: &mut Option<std::time::Instant>,
    held: &mut Vec<Report>,
    arriving: &mut UnboundedReceiver<Vec<Report>>,
) -> bool {
    if !closing.is_cancelled() || since.get_or_insert_with(std::time::Instant::now).elapsed() <= shared.cfg.grace {
        return false;
    }
    tracing::error!(
        "giving up on confirming {} completions at shutdown: no replica in sync (they run again elsewhere)",
        held.len()
    );
    shared.confirming.fetch_sub(held.len(), Ordering::SeqCst);
    forget(shared, std::mem::take(held));
    while let Some(batch) = arriving.recv().await {
        shared.confirming.fetch_sub(batch.len(), Ordering::SeqCst);
        forget(shared, batch);
    }
    true
}
