//! The heartbeat: every lock_renew, one script call extends every lock this executor holds.
//! A lock found lost cancels its shard's handler (its child process is killed) and is counted.

use std::sync::Arc;

use shardctl_common::scripts;
use tokio_util::sync::CancellationToken;

use crate::runtime::Shared;
use crate::stats::Stats;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(shared.cfg.lock_renew);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
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
    }
}

/// Extends every held lock once; false when Redis could not be reached.
pub(crate) async fn beat(shared: &Shared) -> bool {
    let held: Vec<(String, String)> = shared
        .held
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, h)| !h.lost)
        .map(|(r, h)| (r.clone(), h.claim.token.clone()))
        .collect();
    if held.is_empty() {
        return true;
    }
    let mut con = shared.con.clone();
    let lock_ms = shared.cfg.lock_duration.as_millis() as u64;
    match scripts::extend(&mut con, &shared.keys, lock_ms, &held).await {
        Ok(lost) => {
            if lost.is_empty() {
                return true;
            }
            let mut map = shared.held.lock().unwrap();
            for i in lost {
                let (r, token) = &held[i];
                // a reported shard's lock may just have been deleted by its own completion
                if let Some(h) = map.get_mut(r).filter(|h| &h.claim.token == token && !h.reporting) {
                    tracing::warn!(shard = %r, "lock lost: cancelling its handler");
                    h.lost = true;
                    h.cancel.cancel();
                    Stats::add(&shared.stats.locks_lost, 1);
                }
            }
            true
        }
        Err(e) => {
            // the locks live on until lock_duration: the next beat may still save them
            Stats::add(&shared.stats.redis_errors, 1);
            tracing::warn!("heartbeat failed: {e}");
            false
        }
    }
}
