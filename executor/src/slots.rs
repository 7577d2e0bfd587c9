//! Run slots, their state: the claimed shards of this executor wait here, in the order they were claimed, for
//! one of `concurrency` slots. A claim pushes its shards and starts what fits; a shard that ends
//! frees its slot and starts the next. Shards claimed ahead therefore start in claim order
//! (priority order, as the claim script hands them out), whatever order tasks are polled in.
//! At shutdown the waiting ones are given back at once, never started.
//!
//! Every 10 ms, when the shards running turn out slow (none has ended for a while, see
//! [`crate::ahead`]) or the queue has a rate limit, the waiting shards are trimmed to what the
//! executor should hold ahead now: the newest ones beyond are given back to the back of `wait` (behind
//! aggregation jobs and retries), so that other executors, and other work, get them at once
//! instead of waiting behind them here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use shardctl_common::scripts::Claimed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A runtime whose slots a [`Budget`] shares (the executor's shared state, see
/// `crate::starts`, which starts shards): what the budget and a freed [`Slot`] ask of it.
pub(crate) trait Member: Send + Sync {
    /// Its slots.
    fn starts(&self) -> &Starts;
    /// Refs it holds now.
    fn held_now(&self) -> usize;
    /// Starts its waiting shards while slots are free.
    fn start_waiting(self: Arc<Self>);
}

/// A claimed shard waiting for a slot.
pub(crate) struct Waiting {
    pub(crate) claim: Claimed,
    pub(crate) cancel: CancellationToken,
    /// Its task is not measured here yet (`crate::ahead`): its start is counted.
    pub(crate) trying: bool,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) waiting: VecDeque<Waiting>,
    pub(crate) running: usize,
    /// While shards run: when the last one ended, or the first started after none ran.
    pub(crate) busy_since: Option<Instant>,
    /// Set at shutdown: nothing starts any more.
    pub(crate) closed: bool,
}

/// The run slots that the runtimes of one node share, one runtime per partition of a queue
/// (docs/design/partitions.md): at most `limit` shards run at once over all of them,
/// and what they hold (running or claimed ahead) counts against one claim target.
pub(crate) struct Budget {
    pub(crate) limit: usize,
    running: AtomicUsize,
    members: Mutex<Vec<Weak<dyn Member>>>,
    /// Where the next slot freed starts looking for a waiting shard: the runtimes take turns.
    turn: AtomicUsize,
}

impl Budget {
    /// `limit` run slots (the node's `--concurrency`) shared by the runtimes built with it.
    pub(crate) fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget { limit, running: AtomicUsize::new(0), members: Mutex::default(), turn: AtomicUsize::new(0) })
    }

    pub(crate) fn join<M: Member + 'static>(&self, member: &Arc<M>) {
        let member: Weak<M> = Arc::downgrade(member);
        let member: Weak<dyn Member> = member;
        self.members.lock().unwrap().push(member);
    }

    pub(crate) fn members(&self) -> Vec<Arc<dyn Member>> {
        self.members.lock().unwrap().iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether a run slot is free now.
    pub(crate) fn has_free(&self) -> bool {
        self.running.load(Ordering::SeqCst) < self.limit
    }

    /// Takes a run slot if one is free.
    pub(crate) fn take(&self) -> bool {
        self.running.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| (r < self.limit).then_some(r + 1)).is_ok()
    }

    /// Shards held by every runtime (running or waiting for a slot), and how many runtimes
    /// hold some.
    fn holding(&self) -> (usize, usize) {
        let each: Vec<usize> = self.members().iter().map(|m| m.starts().own_outstanding()).collect();
        (each.iter().sum(), each.iter().filter(|n| **n > 0).count())
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.holding().0
    }

    /// A slot was freed: every runtime in turn may start a waiting shard, and claim again.
    fn freed(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
        let members = self.members();
        if members.is_empty() {
            return;
        }
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % members.len();
        for m in members.iter().cycle().skip(first).take(members.len()) {
            m.clone().start_waiting();
            m.starts().freed.notify_one();
        }
    }
}

/// The slots of one executor.
pub(crate) struct Starts {
    pub(crate) state: Mutex<State>,
    pub(crate) concurrency: usize,
    pub(crate) tracker: TaskTracker,
    /// Shared with the node's other runtimes (partitions), if any.
    pub(crate) budget: Option<Arc<Budget>>,
    /// Notified when a shard ends: the claim loop may claim again.
    pub(crate) freed: tokio::sync::Notify,
}

/// Held by a running shard: its slot, freed (and the next shard started) on drop.
pub(crate) struct Slot(pub(crate) Arc<dyn Member>);

impl Drop for Slot {
    fn drop(&mut self) {
        let starts = self.0.starts();
        {
            let mut s = starts.state.lock().unwrap();
            s.running -= 1;
            s.busy_since = (s.running > 0).then(Instant::now);
        }
        starts.freed.notify_one();
        self.0.clone().start_waiting();
        if let Some(b) = &starts.budget {
            b.freed();
        }
    }
}

impl Starts {
    pub(crate) fn new(concurrency: usize, tracker: TaskTracker, budget: Option<Arc<Budget>>) -> Starts {
        Starts { state: Mutex::default(), concurrency, tracker, budget, freed: tokio::sync::Notify::new() }
    }

    /// The tracker of every shard task.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// How many shards to claim to hold `target` (every slot busy plus what to claim ahead).
    /// Runtimes sharing a budget (partitions) share the target: each claims up to its fair part
    /// of it (the target over the runtimes holding shards, itself counted), and one holding
    /// nothing claims one whenever a run slot of the node is free, so no partition, and no
    /// aggregation job, waits for another's work to drain (and none is held here while every
    /// slot is busy: another node may run it).
    pub(crate) fn missing(&self, target: usize) -> usize {
        let own = self.own_outstanding();
        let Some(b) = &self.budget else { return target.saturating_sub(own) };
        let (all, holding) = b.holding();
        let active = holding + usize::from(own == 0);
        let fair = target.div_ceil(active.max(1));
        let missing = target.saturating_sub(all).min(fair.saturating_sub(own));
        if own == 0 && b.has_free() {
            missing.max(1)
        } else {
            missing
        }
    }

    /// Whether a run slot is free for a shard this runtime would claim now (always, without a
    /// shared budget: its claim target says how many).
    pub(crate) fn can_claim(&self) -> bool {
        self.budget.as_ref().is_none_or(|b| b.has_free())
    }

    /// Shards of this runtime claimed and not ended.
    pub(crate) fn own_outstanding(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.running + s.waiting.len()
    }

    /// Slots free now that no waiting shard will take.
    pub(crate) fn free(&self) -> usize {
        let own = {
            let s = self.state.lock().unwrap();
            self.concurrency.saturating_sub(s.running + s.waiting.len())
        };
        match &self.budget {
            Some(b) => own.min(b.limit.saturating_sub(b.outstanding())),
            None => own,
        }
    }

    /// How long the running shards have gone without one ending (`None` when none runs): a
    /// sign that they are slower than the mean run time says, before any of them has ended.
    pub(crate) fn quiet(&self) -> Option<Duration> {
        self.state.lock().unwrap().busy_since.map(|t| t.elapsed())
    }

    /// Takes the newest waiting shards beyond `keep` ahead of the free slots (shards just pushed
    /// that fit in a free slot are about to start, not ahead: the trim may run between a claim's
    /// push and its starts).
    pub(crate) fn trim(&self, keep: usize) -> Vec<Waiting> {
        let mut s = self.state.lock().unwrap();
        let free = self.concurrency.saturating_sub(s.running);
        let n = s.waiting.len().saturating_sub(keep + free);
        let at = s.waiting.len() - n;
        // in claim order: given back to the back of `wait` one by one, they keep it
        s.waiting.drain(at..).collect()
    }

    /// Closes the slots (nothing starts any more) and returns the shards still waiting.
    pub(crate) fn close(&self) -> Vec<Waiting> {
        let mut s = self.state.lock().unwrap();
        s.closed = true;
        s.waiting.drain(..).collect()
    }
}
