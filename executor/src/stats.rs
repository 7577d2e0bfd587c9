//! Counters of what one executor did, readable while it runs (tests, demo, logs, and its
//! membership heartbeat: docs/design/dashboard.md, "Executors"), and the shards it holds
//! longest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Live counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) claimed: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) locks_lost: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) aggregated: AtomicU64,
    pub(crate) redis_errors: AtomicU64,
    pub(crate) with_claim: AtomicU64,
    /// The runtimes whose held shards are this executor's.
    runtimes: Runtimes,
}

/// The runtimes registered with [`Stats::register`].
#[derive(Default)]
struct Runtimes(Mutex<Vec<Weak<dyn HeldShards>>>);

impl std::fmt::Debug for Runtimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtimes")
    }
}

/// A runtime's held shards, as [`Stats::longest_running`] reads them.
pub(crate) trait HeldShards: Send + Sync {
    /// Adds `(task, index in the task, ms held)` of each shard it runs to `out`.
    fn held_since(&self, out: &mut Vec<(String, u64, u64)>);
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Shards claimed.
    pub claimed: u64,
    /// Shards completed and counted by this executor.
    pub completed: u64,
    /// Shards failed for good by this executor.
    pub failed: u64,
    /// Failed attempts that were scheduled for a retry.
    pub retried: u64,
    /// Shards given back at shutdown.
    pub released: u64,
    /// Locks found lost by the heartbeat (handlers cancelled).
    pub locks_lost: u64,
    /// Shards stopped because their task was cancelled (`shardctl cancel`).
    pub cancelled: u64,
    /// Reports refused because the lock was no longer ours.
    pub refused: u64,
    /// Completions of shards already terminal.
    pub duplicates: u64,
    /// Aggregation jobs completed.
    pub aggregated: u64,
    /// Redis calls that failed (and were retried).
    pub redis_errors: u64,
    /// Completions recorded by a claim call (one script call for both), not by one of their own.
    pub with_claim: u64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts the shards `runtime` holds among this executor's (each runtime of a node, one per
    /// partition, registers itself; a runtime gone is forgotten).
    pub(crate) fn register(&self, runtime: Weak<dyn HeldShards>) {
        let mut all = self.runtimes.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(runtime);
    }

    /// The `n` shards held longest by this executor's runtimes, as `(task, index in the task,
    /// ms held)`, longest first.
    pub fn longest_running(&self, n: usize) -> Vec<(String, u64, u64)> {
        let runtimes: Vec<Arc<dyn HeldShards>> =
            self.runtimes.0.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
        let mut all = Vec::new();
        for r in runtimes {
            r.held_since(&mut all);
        }
        all.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        all.truncate(n);
        all
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            claimed: g(&self.claimed),
            completed: g(&self.completed),
            failed: g(&self.failed),
            retried: g(&self.retried),
            released: g(&self.released),
            locks_lost: g(&self.locks_lost),
            cancelled: g(&self.cancelled),
            refused: g(&self.refused),
            duplicates: g(&self.duplicates),
            aggregated: g(&self.aggregated),
            redis_errors: g(&self.redis_errors),
            with_claim: g(&self.with_claim),
        }
    }
}
