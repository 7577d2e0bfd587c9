//! [`Shared`]: the state every part of one executor runtime shares (its claim loop, reporter,
//! heartbeat, run slots and shard tasks), defined below them all: each imports it, it imports
//! none of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use shardctl_common::conn::{Conn, Endpoint};
use shardctl_common::model::ShardRef;
use shardctl_common::scripts::Claimed;
use shardctl_common::{Home, Keys};
use tokio_util::sync::CancellationToken;

use crate::ahead::Ahead;
use crate::cancels::Cancels;
use crate::config::ExecutorConfig;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::registry::Registry;
use crate::slots::Starts;
use crate::stats::Stats;
use crate::tasks::TaskCache;
use crate::waiter::{Member, Waiter};

/// `Shared::claiming` when no claim call is in flight.
pub(crate) const NO_CLAIM: u64 = u64::MAX;

/// A shard this executor holds, until its report is recorded.
pub(crate) struct Held {
    pub(crate) claim: Claimed,
    pub(crate) cancel: CancellationToken,
    pub(crate) lost: bool,
    /// The handler has ended and its outcome is on its way: the reporter's own call may delete
    /// the lock before the heartbeat extends it, which is no loss.
    pub(crate) reporting: bool,
    /// When it was claimed (a backup attempt's time, should it lose).
    pub(crate) since: std::time::Instant,
}

/// State every part of the runtime shares.
pub(crate) struct Shared {
    pub(crate) cfg: ExecutorConfig,
    /// The keyspace this runtime claims in: its queue's home, or one partition.
    pub(crate) keys: Keys,
    /// The queue's home (aggregations read a task's shares through it).
    pub(crate) home: Home,
    pub(crate) registry: Registry,
    pub(crate) endpoint: Endpoint,
    pub(crate) con: Conn,
    /// ref → held shard. std Mutex: only short lookups, never held across an await.
    pub(crate) held: Mutex<HashMap<ShardRef, Held>>,
    pub(crate) tasks: TaskCache,
    pub(crate) stats: Arc<Stats>,
    pub(crate) metrics: Metrics,
    /// Outcomes waiting to be recorded (by the reporter, or with the next claim).
    pub(crate) outbox: Outbox,
    /// Set when shutdown stopped waiting: cancelled shards are released, not failed.
    pub(crate) aborting: AtomicBool,
    /// Tokens are `<instance>:<seq>` (the glossary's instance and claim call).
    pub(crate) instance: String,
    pub(crate) node_id: Arc<str>,
    /// Notified when a `route` marker was popped: routed work waits for a rebalance.
    pub(crate) routing_wanted: Arc<tokio::sync::Notify>,
    /// Observed run and claim times: how many shards to claim ahead.
    pub(crate) ahead: Ahead,
    /// The run slots and the claimed shards waiting for one.
    pub(crate) starts: Starts,
    /// The claim loop's state others read.
    pub(crate) claims: ClaimState,
    /// What the next heartbeat must do besides extending the lease.
    pub(crate) beat: BeatRequests,
    /// The node's shared waiter and this runtime's place in it; `None`: the claim loop blocks
    /// on a connection of its own.
    pub(crate) wake: Option<(Arc<Waiter>, Arc<Member>)>,
    /// Refs held now (the in-flight gauge of a node is the sum over its runtimes).
    pub(crate) held_now: std::sync::atomic::AtomicUsize,
    /// The queue's durability as followed, and the connection of its confirmations.
    pub(crate) durable: shardctl_common::durability::Waiter,
    /// Completions recorded and held until a replica confirms them.
    pub(crate) confirming: AtomicUsize,
}

impl Shared {
    /// A shard as the logs name it: its ref (`<task>:<seq>:<index>`, the keys' own names) and,
    /// for a share of a task over partitions whose record is cached, its partition and the
    /// task's index (the ref's index is the share's own: shard 0 of every share logs as `:0`).
    pub(crate) fn shown(&self, r: &ShardRef) -> String {
        let share = match r.job {
            shardctl_common::model::Job::Shard(i) => {
                // (a log line: the seq alone will do)
                self.tasks
                    .cached(&r.task, r.seq, "")
                    .and_then(|m| m.info.partition().map(|p| (p, m.info.global_index(i))))
            }
            shardctl_common::model::Job::Aggregate => None,
        };
        match share {
            Some((part, index)) => format!("{r} (partition {part}, shard {index} of the task)"),
            None => r.to_string(),
        }
    }

    /// Sets the in-flight gauge: `held` refs of this runtime, plus those of the node's other
    /// runtimes when they share a budget (the gauge is the node's).
    pub(crate) fn publish_in_flight(&self, held: usize) {
        self.held_now.store(held, Ordering::Relaxed);
        let n = match &self.starts.budget {
            Some(b) => b.members().iter().map(|m| m.held_now()).sum(),
            None => held,
        };
        self.metrics.in_flight.set(n as f64);
    }
}

/// The claim loop's state that the heartbeat and the reporter read.
#[derive(Default)]
pub(crate) struct ClaimState {
    /// The seq of the last claim call (one token per call).
    pub(crate) seq: AtomicU64,
    /// The seq of the claim call in flight ([`NO_CLAIM`] when none): its shards may be in `active`
    /// before they are in `held`, so reconciling leaves them alone.
    pub(crate) in_flight: AtomicU64,
    /// The claim loop waits for a run slot to free before it claims again: the reporter lets
    /// completions wait for that claim to take them.
    pub(crate) parked: AtomicBool,
    /// The last claim found a queue rate limit: nothing is held ahead.
    pub(crate) limited: AtomicBool,
}

/// What the next heartbeat must do besides extending the lease.
#[derive(Default)]
pub(crate) struct BeatRequests {
    /// Compare every held token (a claim took a lapsed lease again, Redis may have lost data).
    pub(crate) check: AtomicBool,
    /// Wakes the heartbeat for that check at once.
    pub(crate) check_now: tokio::sync::Notify,
    /// Give back what `active` holds under our tokens that we do not know (a claim call failed:
    /// its reply may have been lost).
    pub(crate) reconcile: AtomicBool,
    /// The queue's cancellation count as the heartbeat knows it: when it moves, the heartbeat
    /// compares every token (a cancelled task's shards lost theirs).
    pub(crate) cancels: Mutex<Cancels>,
}

impl crate::stats::HeldShards for Shared {
    fn held_since(&self, out: &mut Vec<(String, u64, u64)>) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for (r, h) in held.iter().filter(|(_, h)| !h.reporting && !h.lost) {
            let shardctl_common::model::Job::Shard(i) = r.job else { continue };
            // a share's index at the task's (its task is cached: the shard runs with it)
            let index = self.tasks.cached(&r.task, r.seq, "").map_or(i, |m| m.info.global_index(i));
            out.push((r.task.clone(), index, h.since.elapsed().as_millis() as u64));
        }
    }
}
