//! The claim loop: hold `concurrency` shards running plus those claimed ahead ([`crate::ahead`]
//! sizes them from observed run and claim times, at most `prefetch`), and claim again once a
//! claim's worth is missing: at least one shard, or half the shards held ahead, so that short
//! shards come in large batches. Every claimed shard waits, held under the executor's lease, for
//! one of `concurrency` run permits; at shutdown or when lost (its task cancelled) before it
//! started, it is given back at once, never started. With nothing to claim, block on the queue's
//! marker on a dedicated connection (no polling) until work arrives, a delayed shard falls due,
//! or the block timeout passes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use shardctl_common::backoff::redis_retry;
use shardctl_common::conn::Conn;
use shardctl_common::kinds::Served;
use shardctl_common::scripts::{self, ClaimRequest};
use shardctl_common::time::now_ms;
use tokio_util::sync::CancellationToken;

use crate::shared::{Held, Shared, NO_CLAIM};
use crate::slots::Waiting;
use crate::stats::Stats;

/// Completions held for a replica's confirmation beyond which no more shards are claimed (or
/// eight per run slot, when more).
const CONFIRMING_MAX: usize = 4096;

/// Most completions a claim call records: they add ~1 µs each to the claim's time in Redis.
const WITH_CLAIM_MAX: usize = 16;

pub(crate) async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let concurrency = shared.cfg.concurrency;
    let mut blocking: Option<Conn> = None;
    let mut failures = 0u32;
    let mut next_due: Option<u64> = None;
    loop {
        // how many to hold: every slot busy, plus what the observed rates say to claim ahead
        let ahead = if shared.claims.limited.load(Ordering::Relaxed) {
            0
        } else {
            shared.ahead.target(concurrency, shared.cfg.prefetch, shared.starts.quiet())
        };
        let target = concurrency + ahead;
        let missing = shared.starts.missing(target);
        if missing < (ahead / 2).max(1) {
            if parked(&shared, &shutdown).await {
                return;
            }
            continue;
        }
        if shutdown.is_cancelled() {
            return;
        }
        // many completions a replica has not confirmed (docs/design/durability.md): claim no
        // more until they are. Each held shard costs a lock renewal per beat, and with no replica
        // in sync nothing the executor runs counts anyway
        if shared.confirming.load(Ordering::SeqCst) >= CONFIRMING_MAX.max(concurrency * 8) {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                _ = shutdown.cancelled() => return,
            }
            continue;
        }
        let count = missing.min(shared.cfg.max_claim_batch);
        // those beyond the free run slots wait for one: under a rate limit they are not claimed
        let free = shared.starts.free();
        let seq = shared.claims.seq.fetch_add(1, Ordering::Relaxed);
        // a paused worker command's kinds wait for another executor or the pause's end
        let claimable = shared.registry.claimable();
        // shards ahead only for tasks measured short here (docs/design/fairness.md)
        let speeds = shared.ahead.speeds(concurrency);
        let req = ClaimRequest {
            count,
            lock_ms: shared.cfg.lock_duration.as_millis() as u64,
            instance: &shared.instance,
            seq,
            node: &shared.cfg.node_id,
            ahead: count.saturating_sub(free),
            // a task not measured yet is tried ahead one shard a claim, and only while no slot
            // is free here: with one free, this executor would take ahead what an idle one
            // could start now
            speeds: Some((&speeds, usize::from(free == 0))),
            kinds: &claimable,
        };
        let mut con = shared.con.clone();
        // never dropped half-way: the script may have run, and its shards would wait for the sweep
        shared.claims.in_flight.store(seq, Ordering::SeqCst);
        let started = std::time::Instant::now();
        // with nothing else to run (the reporter then keeps completions for this claim), a few
        // completions waiting ride on it: one call for both. Not many, nor while other shards
        // run: a claim carrying hundreds of completions arrives later and the run slots go dry
        // meanwhile (one executor, no-op shards: -30% throughput when tried). Never while the
        // queue's durability asks completions to be confirmed: the reporter records, then confirms them
        let done = if shared.starts.own_outstanding() <= 1 && !crate::durable::waits(&shared).await {
            shared.outbox.take_completions(WITH_CLAIM_MAX)
        } else {
            Vec::new()
        };
        let outcome = if done.is_empty() {
            scripts::claim(&mut con, &shared.keys, &req).await
        } else {
            let finished = crate::report::completions(&done);
            match scripts::complete_and_claim(&mut con, &shared.keys, &finished, &req).await {
                Ok((mut codes, o)) => {
                    let sent: Vec<bool> = done.iter().map(|r| r.sent).collect();
                    crate::report::lost_replies(&shared, &finished, &mut codes, &sent).await;
                    crate::report::count(&shared, &finished, &codes);
                    Stats::add(&shared.stats.with_claim, finished.len() as u64);
                    drop(finished);
                    crate::report::forget(&shared, done);
                    Ok(o)
                }
                Err(e) => {
                    // the reporter records them (again: a completion recorded twice is refused)
                    drop(finished);
                    // the call may have reached Redis: a refusal of their next recording may be
                    // this call's own doing
                    let mut done = done;
                    done.iter_mut().for_each(|r| r.sent = true);
                    shared.outbox.put_back(done);
                    Err(e)
                }
            }
        };
        if let Ok(o) = &outcome {
            shared.metrics.claim_seconds.record(started.elapsed().as_secs_f64());
            shared.ahead.claimed(started.elapsed());
            // under a rate limit nothing is held ahead: the trim gives back what waits
            shared.claims.limited.store(o.limited, Ordering::Relaxed);
        }
        match outcome {
            Ok(o) if !o.shards.is_empty() => {
                failures = 0;
                let trying = shared.ahead.tried(o.shards.iter().map(|c| c.shard_ref.task.as_str()));
                if o.lease_lapsed {
                    // Redis may have lost data (a restart, a failover to a lagging replica): an
                    // id dispatched again there may reuse an incarnation number, so nothing
                    // cached is trusted any more
                    shared.tasks.clear();
                    shared.beat.check.store(true, Ordering::SeqCst);
                    shared.beat.check_now.notify_one();
                }
                Stats::add(&shared.stats.claimed, o.shards.len() as u64);
                tracing::debug!(count = o.shards.len(), first = %o.shards[0].shard_ref, "claimed");
                shared.metrics.claimed.increment(o.shards.len() as u64);
                let mut claimed = Vec::with_capacity(o.shards.len());
                {
                    let mut held = shared.held.lock().unwrap();
                    for claim in o.shards {
                        let cancel = CancellationToken::new();
                        // claimed again while an older claim of ours still runs it (we froze past
                        // the lease and a sweep recovered it): that older handler is stale
                        let key = claim.shard_ref.clone();
                        if let Some(old) = held.get(&key) {
                            old.cancel.cancel();
                        }
                        if claim.backup {
                            shared.metrics.backups_started.increment(1);
                        }
                        let since = std::time::Instant::now();
                        let h =
                            Held { claim: claim.clone(), cancel: cancel.clone(), lost: false, reporting: false, since };
                        held.insert(key, h);
                        let trying = trying && shared.ahead.is_trying(&claim.shard_ref.task);
                        claimed.push(Waiting { claim, cancel, trying });
                    }
                    // set from the map, not counted up and down: a ref claimed again while its
                    // old claim is still held replaces it
                    shared.publish_in_flight(held.len());
                }
                // in claim order: those that fit start now, the others when a running shard ends
                crate::starts::push(&shared, claimed);
                shared.claims.in_flight.store(NO_CLAIM, Ordering::SeqCst);
            }
            Ok(o) if o.busy => {
                // a rate limit and no free slot: claim again when a running shard ends
                shared.claims.in_flight.store(NO_CLAIM, Ordering::SeqCst);
                failures = 0;
                if parked(&shared, &shutdown).await {
                    return;
                }
            }
            Ok(o) => {
                shared.claims.in_flight.store(NO_CLAIM, Ordering::SeqCst);
                failures = 0;
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
                        pause(redis_retry(failures), &shutdown).await;
                    }
                }
                if next_due.is_some_and(|d| d <= now_ms()) {
                    next_due = None;
                }
            }
            Err(e) => {
                shared.claims.in_flight.store(NO_CLAIM, Ordering::SeqCst);
                // the script may have run and its reply been lost: the heartbeat reconciles
                shared.beat.reconcile.store(true, Ordering::SeqCst);
                // Redis may be another server when it answers again (see `lease_lapsed` above)
                shared.tasks.clear();
                // and it may have retaken a lapsed lease: compare every token at the next beat
                shared.beat.check.store(true, Ordering::SeqCst);
                shared.beat.check_now.notify_one();
                Stats::add(&shared.stats.redis_errors, 1);
                shared.metrics.redis_error(&e);
                failures += 1;
                let d = redis_retry(failures);
                tracing::warn!("claim failed (retry in {d:?}): {e}");
                pause(d, &shutdown).await;
            }
        }
    }
}

/// Waits until a run slot frees (true: shutdown came first). Meanwhile the reporter keeps
/// completions for the claim that follows.
async fn parked(shared: &Shared, shutdown: &CancellationToken) -> bool {
    shared.claims.parked.store(true, Ordering::SeqCst);
    let stop = tokio::select! {
        biased;
        _ = shutdown.cancelled() => true,
        _ = shared.starts.freed.notified() => false,
    };
    shared.claims.parked.store(false, Ordering::SeqCst);
    stop
}

async fn pause(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// The markers an executor of `node` serving `served` blocks on: the queue's (`delayed`, `route`,
/// an operator's wake-up), its node's, and its kinds' lanes' (docs/design/lanes.md).
pub(crate) fn markers(keys: &shardctl_common::Keys, node: &str, served: &Served) -> Vec<String> {
    let mut v = vec![keys.marker(), keys.node_marker(node)];
    match served.kinds() {
        None => v.push(keys.any_kind_marker()),
        Some(kinds) => v.extend(kinds.iter().map(|k| keys.lane_marker(k))),
    }
    v
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
    if let Some((waiter, me)) = &shared.wake {
        // the node's waiter blocks for every waiting runtime and wakes this one when its marker
        // pops
        me.wait(waiter, wait, shutdown).await;
        return Ok(());
    }
    if blocking.is_none() {
        *blocking = Some(shared.endpoint.blocking(shared.cfg.block_timeout).await?);
    }
    let con = blocking.as_mut().expect("just set");
    // BZPOPMIN takes seconds with decimals; 0 would block forever
    let secs = wait.as_secs_f64().max(0.01);
    let mut cmd = redis::cmd("BZPOPMIN");
    cmd.arg(markers(&shared.keys, &shared.cfg.node_id, shared.registry.served())).arg(secs);
    let popped: Option<(String, String, f64)> = tokio::select! {
        r = cmd.query_async(con) => r?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    // `delayed` (its score is a due time by the server's clock): the next claim says how long
    // from now, and the executor waits that long (a time the scripts wrote is never compared
    // with this host's clock)
    if let Some((key, member, score)) = &popped {
        if !shared.starts.can_claim() {
            // the node's run slots filled meanwhile (a partition's runtime): this wake-up is
            // another executor's, it goes back
            let () = redis::cmd("ZADD").arg(key).arg(*score).arg(member).query_async(con).await?;
            return Ok(());
        }
    }
    if popped.is_some_and(|(_, member, _)| member == "route") {
        // routed work waits for a rebalance: the membership loop runs one now
        shared.routing_wanted.notify_one();
    }
    Ok(())
}
