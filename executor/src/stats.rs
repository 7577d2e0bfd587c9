//! Counters of what one executor did, readable while it runs (tests, demo, logs, and its
//! membership heartbeat: docs/design/dashboard.md, "Executors"), and the shards it runs now
//! with when each started.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

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
    /// The shards whose handlers run now (refs, as the task's shown), by when each started.
    running: Mutex<HashMap<String, Instant>>,
}

/// A running shard's place in [`Stats`]'s list, left when dropped.
pub(crate) struct RunningGuard<'a> {
    stats: &'a Stats,
    shown: String,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.stats.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.shown);
    }
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

    /// A handler of shard `shown` (`<task> <index>`) starts: listed until the guard drops (when
    /// it ends, or should it unwind).
    pub(crate) fn running(&self, shown: String) -> RunningGuard<'_> {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(shown.clone(), Instant::now());
        RunningGuard { stats: self, shown }
    }

    /// The `n` shards running longest, with how long each has run (ms), longest first.
    pub fn longest_running(&self, n: usize) -> Vec<(String, u64)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(String, u64)> =
            running.iter().map(|(r, since)| (r.clone(), since.elapsed().as_millis() as u64)).collect();
        drop(running);
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
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
