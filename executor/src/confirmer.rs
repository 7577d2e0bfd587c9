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

use crate::durable::Completions;
use crate::outcome::Report;
use crate::report::{completions, count, forget, record};
use crate::shared::Shared;

/// Pause after a confirmation whose wait timed out (it waited the queue's timeout already).
const AGAIN: Duration = Duration::from_millis(100);

/// Confirms what arrives on `held` until the reporter is gone (the channel closed) and nothing
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
        let finished = completions(&held);
        match crate::durable::completions(&shared, &finished).await {
            Completions::Durable => {
                count(&shared, &finished, &vec![Ok(1); finished.len()]);
                drop(finished);
                let n = held.len();
                forget(&shared, std::mem::take(&mut held));
                shared.confirming.fetch_sub(n, Ordering::SeqCst);
                continue;
            }
            Completions::Lost => {
                // what the calls had recorded is gone: record it again (a completion one did keep
                // is refused, then found recorded, as after a lost reply)
                tracing::warn!("{} completions were lost (a failover): recording them again", held.len());
                shared.metrics.durability_lost.increment(held.len() as u64);
                drop(finished);
                for r in &mut held {
                    r.sent = true;
                }
                let again = record(&shared, &held, &closing).await;
                let (still, done): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut held).into_iter().zip(again).partition(|(_, s)| *s);
                shared.confirming.fetch_sub(done.len(), Ordering::SeqCst);
                forget(&shared, done.into_iter().map(|(r, _)| r).collect());
                held = still.into_iter().map(|(r, _)| r).collect();
                continue;
            }
            Completions::Pending => {}
        }
        if closing.is_cancelled() {
            let since = *closing_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > shared.cfg.grace {
                tracing::error!(
                    "giving up on confirming {} completions at shutdown: no replica in sync (they run again elsewhere)",
                    held.len()
                );
                let n = held.len();
                forget(&shared, std::mem::take(&mut held));
                shared.confirming.fetch_sub(n, Ordering::SeqCst);
                // what still arrives is given up the same way
                while let Some(batch) = arriving.recv().await {
                    shared.confirming.fetch_sub(batch.len(), Ordering::SeqCst);
                    forget(&shared, batch);
                }
                return;
            }
        }
        tokio::time::sleep(AGAIN).await;
    }
}
