//! The heartbeat: every lock_renew, one script call extends every lock this executor holds.
//! A lock found lost cancels its shard's handler (its child process is killed) and is counted.
//! Between two beats, an executor holding shards reads the queue's `cancels` count every second
//! and beats at once when it moved, so a cancelled task's handlers stop within about a second.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use shardctl_common::model::ShardRef;
use shardctl_common::scripts;
use tokio_util::sync::CancellationToken;

use crate::shared::{Shared, NO_CLAIM};
use crate::stats::Stats;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(shared.cfg.lock_renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut poll = tokio::time::interval(CANCEL_POLL.min(shared.cfg.lock_renew));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // a claim took our lapsed lease again: check our tokens now
            _ = shared.beat.check_now.notified() => {}
            // a task cancelled while we run its shards: their handlers stop now, not at the tick
            _ = poll.tick() => {
                if !cancelled_since(&shared).await {
                    continue;
                }
            }
            _ = stop.cancelled() => return,
        }
        // a failed beat is retried soon: the locks live only until lock_duration
        let retry = (shared.cfg.lock_renew / 4).min(std::time::Duration::from_secs(1));
        while !beat(&shared).await {
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.cancelled() => return,
            }
        }
        beats += 1;
        if beats % RECONCILE_EVERY == 0 || shared.beat.reconcile.swap(false, Ordering::SeqCst) {
            if let Err(e) = reconcile(&shared).await {
                shared.beat.reconcile.store(true, Ordering::SeqCst);
                tracing::warn!("reconciling held shards: {e}");
            }
        }
    }
}

/// How often an executor holding shards reads the queue's `cancels` count between two beats.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a task was cancelled since the last beat (the queue's `cancels` count moved) while
/// this executor holds shards: one HGET, none when it holds nothing.
async fn cancelled_since(shared: &Shared) -> bool {
    if shared.held.lock().unwrap().is_empty() {
        return false;
    }
    let mut con = shared.con.clone();
    let now: redis::RedisResult<Option<String>> =
        redis::cmd("HGET").arg(shared.keys.meta()).arg("cancels").query_async(&mut con).await;
    let known = shared.beat.cancels.lock().unwrap().clone();
    now.is_ok_and(|c| known.differs(c.as_deref().unwrap_or("0")))
}

/// Extends every held lock once; false when Redis could not be reached.
pub(crate) async fn beat(shared: &Shared) -> bool {
    // read before `held`: a claim in flight may have shards in `active` not yet in `held`
    let claim_in_flight = shared.claims.in_flight.load(Ordering::SeqCst) != NO_CLAIM;
    let (keys, held): (Vec<ShardRef>, Vec<(String, String)>) = shared
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost)
        .map(|(r, h)| (r.clone(), (r.to_string(), h.claim.token.clone())))
        .unzip();
    let mut con = shared.con.clone();
    let lock_ms = shared.cfg.lock_duration.as_millis() as u64;
    // the lease is extended even with nothing held: an idle executor stays visibly alive
    let check = shared.beat.check.swap(false, Ordering::SeqCst);
    let known = shared.beat.cancels.lock().unwrap().clone();
    match scripts::extend(&mut con, &shared.keys, &shared.instance, lock_ms, &held, check, &known.sent()).await {
        Ok(scripts::Beat { lost, cancelled, cancels }) => {
            *shared.beat.cancels.lock().unwrap() = known.after(cancels, claim_in_flight);
            shared.metrics.heartbeats.increment(1);
            shared.metrics.locks_extended.increment((held.len() - lost.len() - cancelled.len()) as u64);
            if lost.is_empty() && cancelled.is_empty() {
                return true;
            }
            let mut map = shared.held.lock().unwrap();
            let stopped = lost.into_iter().map(|i| (i, false)).chain(cancelled.into_iter().map(|i| (i, true)));
            for (i, by_cancel) in stopped {
                let (_, token) = &held[i];
                // a reported shard's lock may just have been deleted by its own completion
                if let Some(h) = map.get_mut(&keys[i]).filter(|h| &h.claim.token == token && !h.reporting) {
                    h.lost = true;
                    h.cancel.cancel();
                    if h.claim.backup {
                        // a backup that did not finish first (docs/design/speculation.md)
                        shared.metrics.backup_lost_seconds.record(h.since.elapsed().as_secs_f64());
                    }
                    if by_cancel {
                        tracing::info!(shard = %shared.shown(&h.claim.shard_ref), "task cancelled: stopping its handler");
                        // its spec goes too: a later task under the same id is another task
                        shared.tasks.forget(&h.claim.shard_ref.task);
                        Stats::add(&shared.stats.cancelled, 1);
                        shared.metrics.cancelled.increment(1);
                    } else {
                        tracing::warn!(shard = %shared.shown(&h.claim.shard_ref), "lock lost: cancelling its handler");
                        Stats::add(&shared.stats.locks_lost, 1);
                        shared.metrics.locks_lost.increment(1);
                    }
                }
            }
            true
        }
        Err(e) => {
            // the locks live on until lock_duration: the next beat may still save them
            if check {
                shared.beat.check.store(true, Ordering::SeqCst);
            }
            Stats::add(&shared.stats.redis_errors, 1);
            shared.metrics.redis_error(&e);
            tracing::warn!("heartbeat failed: {e}");
            false
        }
    }
}

/// Every this many beats, compare what `active` holds under our tokens with what we know.
const RECONCILE_EVERY: u64 = 4;

/// Gives back shards `active` holds under this executor's tokens that it does not know: taken by
/// a claim call whose reply was lost. The claim in flight is left alone (its shards may be in
/// `active` before they are in `held`); `claiming` is read before `held` for that.
pub(crate) async fn reconcile(shared: &Shared) -> shardctl_common::Result<()> {
    let mut con = shared.con.clone();
    let mut all: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(shared.keys.active()).query_async(&mut con).await?;
    // backup attempts too (docs/design/speculation.md): a lost reply leaves one held by nobody
    let backups: Vec<(String, String)> = redis::cmd("HGETALL").arg(shared.keys.backups()).query_async(&mut con).await?;
    let mut orphan_backups = Vec::new();
    let mine = format!("{}:", shared.instance);
    let in_flight = format!("{mine}{}", shared.claims.in_flight.load(Ordering::SeqCst));
    let orphans: Vec<(String, String)> = {
        let held = shared.held.lock().unwrap();
        let known = |r: &str| r.parse::<ShardRef>().is_ok_and(|k| held.contains_key(&k));
        for (r, t) in backups {
            if t.starts_with(&mine) && t != in_flight && !known(&r) {
                orphan_backups.push((r, t));
            }
        }
        all.retain(|r, t| t.starts_with(&mine) && *t != in_flight && !known(r));
        all.into_iter().chain(orphan_backups).collect()
    };
    let n = scripts::disown(&mut con, &shared.keys, &orphans).await?;
    if n > 0 {
        tracing::warn!("gave back {n} shards of claims whose reply was lost");
    }
    Ok(())
}
