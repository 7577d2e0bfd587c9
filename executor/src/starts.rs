//! Run slots: the claimed shards of this executor wait here, in the order they were claimed, for
//! one of `concurrency` slots. A claim pushes its shards and starts what fits; a shard that ends
//! frees its slot and starts the next. Shards claimed ahead therefore start in claim order
//! (priority order, as the claim script hands them out), whatever order tasks are polled in.
//! At shutdown the waiting ones are given back at once, never started.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use shardctl_common::scripts::Claimed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::Shared;

/// A claimed shard waiting for a slot.
pub(crate) struct Waiting {
    pub(crate) claim: Claimed,
    pub(crate) cancel: CancellationToken,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Waiting>,
    running: usize,
    /// Set at shutdown: nothing starts any more.
    closed: bool,
}

/// The slots of one executor.
pub(crate) struct Starts {
    state: Mutex<State>,
    concurrency: usize,
    tracker: TaskTracker,
    /// Notified when a shard ends: the claim loop may claim again.
    pub(crate) freed: tokio::sync::Notify,
}

/// Held by a running shard: its slot, freed (and the next shard started) on drop.
pub(crate) struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        let starts = &self.0.starts;
        starts.state.lock().unwrap().running -= 1;
        starts.freed.notify_one();
        start_next(&self.0);
    }
}

impl Starts {
    pub(crate) fn new(concurrency: usize, tracker: TaskTracker) -> Starts {
        Starts { state: Mutex::default(), concurrency, tracker, freed: tokio::sync::Notify::new() }
    }

    /// The tracker of every shard task.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Shards claimed and not ended: running or waiting.
    pub(crate) fn outstanding(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.running + s.waiting.len()
    }

    /// Slots free now that no waiting shard will take.
    pub(crate) fn free(&self) -> usize {
        let s = self.state.lock().unwrap();
        self.concurrency.saturating_sub(s.running + s.waiting.len())
    }

    /// Closes the slots (nothing starts any more) and returns the shards still waiting.
    pub(crate) fn close(&self) -> Vec<Waiting> {
        let mut s = self.state.lock().unwrap();
        s.closed = true;
        s.waiting.drain(..).collect()
    }
}

/// Queues claimed shards, in claim order, and starts what fits.
pub(crate) fn push(shared: &Arc<Shared>, shards: impl IntoIterator<Item = Waiting>) {
    shared.starts.state.lock().unwrap().waiting.extend(shards);
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
            s.running += 1;
            w
        };
        let slot = Slot(shared.clone());
        if next.cancel.is_cancelled() {
            crate::run::unstarted(shared, next.claim, &next.cancel);
            drop(slot);
            // the slot's drop started the next ones
            return;
        }
        // boxed: the task then moves a pointer, not the whole future (a few KB), on its way in
        // boxed: the task then moves a pointer, not the whole future (a few KB), on its way in
        starts.tracker.spawn(Box::pin(crate::run::shard(shared.clone(), next.claim, next.cancel, slot)));
    }
}
