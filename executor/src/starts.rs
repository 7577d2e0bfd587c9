//! Starting shards in their run slots ([`crate::slots`]): a claim pushes its shards and starts
//! what fits; a shard that ends frees its slot and starts the next; the trim gives back what is
//! held ahead beyond what the executor should hold now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shared::Shared;
use crate::slots::{Member, Slot, Starts, Waiting};

/// Queues claimed shards, in claim order, and starts what fits. An aggregation job goes first:
/// its task is otherwise done, and it must not wait behind shards claimed ahead.
pub(crate) fn push(shared: &Arc<Shared>, shards: impl IntoIterator<Item = Waiting>) {
    {
        let mut s = shared.starts.state.lock().unwrap();
        for w in shards {
            if w.claim.shard_ref.is_aggregate() {
                s.waiting.push_front(w);
            } else {
                s.waiting.push_back(w);
            }
        }
    }
    start_next(shared);
}

/// Starts waiting shards while slots are free. A shard lost while it waited (its task cancelled,
/// or claimed again) is let go without starting.
fn start_next(shared: &Arc<Shared>) {
    let starts = &shared.starts;
    loop {
        let next = {
            let mut s = starts.state.lock().unwrap();
            if s.closed || s.running >= starts.concurrency {
                return;
            }
            let Some(w) = s.waiting.pop_front() else { return };
            if w.cancel.is_cancelled() {
                drop(s);
                if w.trying {
                    shared.ahead.started_trying(&w.claim.shard_ref.task);
                }
                crate::run::unstarted(shared, w.claim, &w.cancel);
                continue;
            }
            if starts.budget.as_ref().is_some_and(|b| !b.take()) {
                // every slot of the node is busy: the next freed one starts it
                s.waiting.push_front(w);
                return;
            }
            if s.running == 0 {
                s.busy_since = Some(Instant::now());
            }
            s.running += 1;
            w
        };
        if next.trying {
            shared.ahead.started_trying(&next.claim.shard_ref.task);
        }
        let slot = Slot(shared.clone());
        // boxed: the task then moves a pointer, not the whole future (a few KB), on its way in
        starts.tracker.spawn(Box::pin(crate::run::shard(shared.clone(), next.claim, next.cancel, slot)));
    }
}

/// How often the waiting shards are trimmed.
const TRIM_EVERY: Duration = Duration::from_millis(10);

/// Trims the waiting shards every [`TRIM_EVERY`] until `stop`: those beyond what the executor
/// should hold ahead now (none under a queue rate limit) are given back.
pub(crate) async fn trim_loop(shared: Arc<Shared>, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        // only on a sign, not on the mean's ordinary moves: giving back and claiming again costs
        // two calls and sends the shards to the back of `wait`
        let quiet = shared.starts.quiet();
        let keep = if shared.claims.limited.load(std::sync::atomic::Ordering::Relaxed) {
            0
        } else if shared.ahead.is_quiet(quiet) {
            shared.ahead.target(shared.cfg.concurrency, shared.cfg.prefetch, quiet)
        } else {
            continue;
        };
        let excess = shared.starts.trim(keep);
        if !excess.is_empty() {
            tracing::debug!(released = excess.len(), keep, "giving back shards claimed ahead");
            for w in excess {
                if w.trying {
                    shared.ahead.started_trying(&w.claim.shard_ref.task);
                }
                if w.claim.shard_ref.is_aggregate() {
                    // to the front, as it came
                    crate::run::unstarted(&shared, w.claim, &w.cancel);
                } else {
                    crate::run::given_back(&shared, w.claim, &w.cancel);
                }
            }
        }
    }
}

impl Member for Shared {
    fn starts(&self) -> &Starts {
        &self.starts
    }
    fn held_now(&self) -> usize {
        self.held_now.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn start_waiting(self: Arc<Self>) {
        start_next(&self);
    }
}
