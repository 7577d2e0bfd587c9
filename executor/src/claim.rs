//! The claim loop: take a slot first (a concurrency permit, or with `prefetch` one of the
//! concurrency + prefetch slots), then as many more as are free, claim that many shards in one
//! script call, and start each. A prefetched shard waits, held under the executor's lease, until
//! a running one ends; at shutdown it is given back at once, never started. With nothing to
//! claim, block on the queue's marker on a dedicated connection (no polling) until work arrives,
//! a delayed shard falls due, or the block timeout passes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::scripts::{self, ClaimRequest};
use shardctl_common::time::now_ms;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::{Shared, NO_CLAIM};
use crate::stats::Stats;

/// Backoff after a failed Redis call: doubles from 100 ms up to 5 s.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5))
}

pub(crate) async fn run(shared: Arc<Shared>, tracker: &TaskTracker, shutdown: CancellationToken) {
    let permits = Arc::new(Semaphore::new(shared.cfg.concurrency + shared.cfg.prefetch));
    // with prefetch, a claimed shard also needs one of `concurrency` run permits to start
    let running = (shared.cfg.prefetch > 0).then(|| Arc::new(Semaphore::new(shared.cfg.concurrency)));
    let mut blocking: Option<Conn> = None;
    let mut failures = 0u32;
    let mut next_due: Option<u64> = None;
    loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            p = permits.clone().acquire_owned() => p.expect("semaphore never closes"),
        };
        let mut batch = vec![first];
        while batch.len() < shared.cfg.max_claim_batch {
            match permits.clone().try_acquire_owned() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        let req = ClaimRequest {
            count: batch.len(),
            lock_ms: shared.cfg.lock_duration.as_millis() as u64,
            token_base: &shared.token_base,
            seq,
            node: &shared.cfg.node_id,
        };
        let mut con = shared.con.clone();
        // never dropped half-way: the script may have run, and its shards would wait for the sweep
        shared.claiming.store(seq, Ordering::SeqCst);
        let started = std::time::Instant::now();
        let outcome = scripts::claim(&mut con, &shared.keys, &req).await;
        if outcome.is_ok() {
            shared.metrics.claim_seconds.record(started.elapsed().as_secs_f64());
        }
        match outcome {
            Ok(o) if !o.shards.is_empty() => {
                failures = 0;
                if o.lease_lapsed {
                    // Redis may have lost data (a restart, a failover to a lagging replica): an
                    // id dispatched again there may reuse an incarnation number, so nothing
                    // cached is trusted any more
                    shared.tasks.clear();
                    shared.must_check.store(true, Ordering::SeqCst);
                    shared.check_tokens.notify_one();
                }
                Stats::add(&shared.stats.claimed, o.shards.len() as u64);
                shared.metrics.claimed.increment(o.shards.len() as u64);
                for (claim, permit) in o.shards.into_iter().zip(batch) {
                    let cancel = CancellationToken::new();
                    {
                        let mut held = shared.held.lock().unwrap();
                        // claimed again while an older claim of ours still runs it (we froze past
                        // the lease and a sweep recovered it): that older handler is stale
                        if let Some(old) = held.get(&claim.shard_ref.to_string()) {
                            old.cancel.cancel();
                        }
                        held.insert(
                            claim.shard_ref.to_string(),
                            crate::runtime::Held {
                                claim: claim.clone(),
                                cancel: cancel.clone(),
                                lost: false,
                                reporting: false,
                            },
                        );
                        // set from the map, not counted up and down: a ref claimed again while
                        // its old claim is still held replaces it
                        shared.metrics.in_flight.set(held.len() as f64);
                    }
                    match &running {
                        None => {
                            tracker.spawn(crate::run::shard(shared.clone(), claim, cancel, permit));
                        }
                        Some(running) => {
                            let (shared, running, shutdown) = (shared.clone(), running.clone(), shutdown.clone());
                            tracker.spawn(async move {
                                tokio::select! {
                                    biased;
                                    _ = shutdown.cancelled() => crate::run::unstarted(&shared, claim, &cancel, permit),
                                    // lost (its task cancelled, or claimed again) before it started
                                    _ = cancel.cancelled() => crate::run::unstarted(&shared, claim, &cancel, permit),
                                    p = running.acquire_owned() => {
                                        let p = p.expect("semaphore never closes");
                                        crate::run::shard(shared, claim, cancel, (permit, p)).await
                                    }
                                }
                            });
                        }
                    }
                }
                shared.claiming.store(NO_CLAIM, Ordering::SeqCst);
            }
            Ok(o) => {
                shared.claiming.store(NO_CLAIM, Ordering::SeqCst);
                failures = 0;
                drop(batch);
                // the script says how long from now (the server's clock); the wait is local
                next_due = o.next_due_in_ms.map(|d| now_ms() + d).or(next_due.filter(|&d| d > now_ms()));
                let wait = match next_due {
                    Some(due) if !o.paused => {
                        Duration::from_millis(due.saturating_sub(now_ms())).min(shared.cfg.block_timeout)
                    }
                    _ => shared.cfg.block_timeout,
                };
                match wait_for_work(&shared, &mut blocking, wait, &shutdown).await {
                    Ok(()) => {}
                    Err(e) => {
                        blocking = None;
                        Stats::add(&shared.stats.redis_errors, 1);
                        shared.metrics.redis_error(&e);
                        tracing::warn!("waiting for work: {e}");
                        failures += 1;
                        pause(retry_delay(failures), &shutdown).await;
                    }
                }
                if next_due.is_some_and(|d| d <= now_ms()) {
                    next_due = None;
                }
            }
            Err(e) => {
                shared.claiming.store(NO_CLAIM, Ordering::SeqCst);
                drop(batch);
                // the script may have run and its reply been lost: the heartbeat reconciles
                shared.must_reconcile.store(true, Ordering::SeqCst);
                // Redis may be another server when it answers again (see `lease_lapsed` above)
                shared.tasks.clear();
                // and it may have retaken a lapsed lease: compare every token at the next beat
                shared.must_check.store(true, Ordering::SeqCst);
                shared.check_tokens.notify_one();
                Stats::add(&shared.stats.redis_errors, 1);
                shared.metrics.redis_error(&e);
                failures += 1;
                tracing::warn!("claim failed (retry in {:?}): {e}", retry_delay(failures));
                pause(retry_delay(failures), &shutdown).await;
            }
        }
    }
}

async fn pause(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Blocks on the marker for up to `wait`. Returns the due time a `delayed` marker announced; a
/// `route` marker wakes the membership loop for a rebalance.
async fn wait_for_work(
    shared: &Shared,
    blocking: &mut Option<Conn>,
    wait: Duration,
    shutdown: &CancellationToken,
) -> shardctl_common::Result<()> {
    if wait.is_zero() {
        return Ok(());
    }
    if blocking.is_none() {
        *blocking = Some(shared.client.blocking(shared.cfg.block_timeout).await?);
    }
    let con = blocking.as_mut().expect("just set");
    // BZPOPMIN takes seconds with decimals; 0 would block forever
    let secs = wait.as_secs_f64().max(0.01);
    let mut cmd = redis::cmd("BZPOPMIN");
    cmd.arg(shared.keys.marker()).arg(shared.keys.node_marker(&shared.cfg.node_id)).arg(secs);
    let popped: Option<(String, String, f64)> = tokio::select! {
        r = cmd.query_async(con) => r?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    // `delayed` (its score is a due time by the server's clock): the next claim says how long
    // from now, and the executor waits that long (a time the scripts wrote is never compared
    // with this host's clock)
    if popped.is_some_and(|(_, member, _)| member == "route") {
        // routed work waits for a rebalance: the membership loop runs one now
        shared.routing_wanted.notify_one();
    }
    Ok(())
}
