//! The executor runtime: wires the claim loop, the shard tasks, the heartbeat and the reporter
//! together, and shuts them down in order (stop claiming, drain for the grace time, release the
//! rest, flush every report).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shardctl_common::conn::Endpoint;
use shardctl_common::{Home, Keys, Result};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ExecutorConfig;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::shared::{BeatRequests, ClaimState, Shared, NO_CLAIM};
use crate::stats::{Stats, StatsSnapshot};
use crate::tasks::TaskCache;

/// What the runtimes of one node over a partitioned queue share: the run slots, the counters,
/// and on one server the blocking connection.
pub struct Sharing {
    budget: Arc<crate::slots::Budget>,
    stats: Arc<Stats>,
    waiter: Option<Arc<crate::waiter::Waiter>>,
}

impl Sharing {
    /// `concurrency` run slots over every runtime built with it; on one server (not a cluster)
    /// one blocking connection for all of them ([`Sharing::wait_for_all`]).
    pub fn new(concurrency: usize, endpoint: &Endpoint) -> Sharing {
        Sharing::counting(concurrency, endpoint, Arc::new(Stats::default()))
    }

    /// [`Sharing::new`], counting in `stats` (a node keeps its counters when it re-forms its
    /// runtimes).
    pub fn counting(concurrency: usize, endpoint: &Endpoint, stats: Arc<Stats>) -> Sharing {
        Sharing {
            budget: crate::slots::Budget::new(concurrency),
            stats,
            waiter: (!endpoint.is_cluster()).then(Default::default),
        }
    }

    /// Blocks for every runtime built with it on one connection until `stop` (on a cluster each
    /// runtime blocks on its own: this returns at once). Start it once the runtimes are built.
    pub async fn wait_for_all(&self, endpoint: Endpoint, block: std::time::Duration, stop: CancellationToken) {
        if let Some(w) = &self.waiter {
            w.clone().run(endpoint, block, stop).await;
        }
    }
}

/// What a runtime of a node shares with the node ([`Executor::connect_in`]).
pub enum With<'a> {
    /// Its counters only: the node's one runtime.
    Stats(Arc<Stats>),
    /// The run budget, the counters and the blocking connection of a node's runtimes over
    /// partitions.
    Sharing(&'a Sharing),
}

/// One executor process's runtime.
pub struct Executor {
    shared: Arc<Shared>,
}

impl Executor {
    /// Connects to Redis, to run in queue `home`; fails at once when it cannot be reached or the
    /// config is invalid.
    pub async fn connect(endpoint: Endpoint, home: Home, cfg: ExecutorConfig, registry: Registry) -> Result<Self> {
        Executor::connect_in(endpoint, home, None, cfg, registry, With::Stats(Arc::new(Stats::default()))).await
    }

    /// [`Executor::connect`] for one runtime of a node: in `home` itself (`partition` `None`) or
    /// in one of its partitions (made by [`Home::partition`]), counting in the node's stats or
    /// sharing its run budget with the node's other runtimes (`with`).
    pub async fn connect_in(
        endpoint: Endpoint,
        home: Home,
        partition: Option<Keys>,
        cfg: ExecutorConfig,
        registry: Registry,
        with: With<'_>,
    ) -> Result<Self> {
        let (with, stats) = match with {
            With::Stats(stats) => (None, stats),
            With::Sharing(w) => (Some(w), w.stats.clone()),
        };
        let keys = partition.unwrap_or_else(|| home.keys().clone());
        let budget = with.map(|w| w.budget.clone());

        cfg.validate().map_err(shardctl_common::Error::Invalid)?;
        registry.check()?;
        let con = endpoint.manager().await?;
        let node_id: Arc<str> = Arc::from(cfg.node_id.as_str());
        let instance = cfg.instance.clone();
        let concurrency = cfg.concurrency;
        let metrics = Metrics::new(keys.queue(), &cfg.node_id);
        let routing_wanted = Arc::new(tokio::sync::Notify::new());
        let markers = crate::claim::markers(&keys, &cfg.node_id, registry.served());
        let durable = shardctl_common::durability::Waiter::new(home.clone());
        let shared = Arc::new(Shared {
            cfg,
            keys,
            home,
            registry,
            endpoint,
            con,
            held: Mutex::new(HashMap::new()),
            tasks: TaskCache::default(),
            stats,
            metrics,
            outbox: Default::default(),
            aborting: AtomicBool::new(false),
            instance,
            routing_wanted: routing_wanted.clone(),
            node_id,
            ahead: Default::default(),
            starts: crate::slots::Starts::new(concurrency, TaskTracker::new(), budget.clone()),
            claims: ClaimState { in_flight: AtomicU64::new(NO_CLAIM), ..Default::default() },
            beat: BeatRequests::default(),
            wake: with.and_then(|w| w.waiter.as_ref()).map(|w| {
                let budget = budget.clone();
                let can_claim = Box::new(move || budget.as_ref().is_none_or(|b| b.has_free()));
                (w.clone(), w.join(markers, routing_wanted.clone(), can_claim))
            }),
            held_now: Default::default(),
            durable,
            confirming: Default::default(),
        });
        if let Some(b) = &budget {
            b.join(&shared);
        }
        let weak: std::sync::Weak<dyn crate::stats::HeldShards> =
            Arc::downgrade(&(shared.clone() as Arc<dyn crate::stats::HeldShards>));
        shared.stats.register(weak);
        Ok(Executor { shared })
    }

    /// Notified when routed work waits for a rebalance (whoever rebalances should do it now).
    pub fn routing_wanted(&self) -> Arc<tokio::sync::Notify> {
        self.shared.routing_wanted.clone()
    }

    /// Live counters of this executor.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// Runs until `shutdown` is cancelled, then drains for the grace time, releases what is
    /// still running so it is claimable at once, and flushes every report.
    pub async fn run(self, shutdown: CancellationToken) -> Result<StatsSnapshot> {
        self.run_until(shutdown, CancellationToken::new()).await
    }

    /// [`Executor::run`], where cancelling `now` during the drain ends it at once: the shards
    /// still running are released and their handlers stopped (a second Ctrl-C).
    pub async fn run_until(self, shutdown: CancellationToken, now: CancellationToken) -> Result<StatsSnapshot> {
        let Executor { shared } = self;
        let tracker = shared.starts.tracker().clone();
        let closing = CancellationToken::new();
        // completions held for a replica's confirmation go from the reporter to the confirmer
        let (to_confirm, arriving) = tokio::sync::mpsc::unbounded_channel();
        let confirmer = tokio::spawn(crate::confirmer::run(shared.clone(), arriving, closing.clone()));
        let reporter = tokio::spawn(crate::report::run(shared.clone(), closing.clone(), to_confirm));
        let beat_stop = CancellationToken::new();
        let heartbeat = tokio::spawn(crate::heartbeat::run(shared.clone(), beat_stop.clone()));
        // if this future is dropped half-way, stop everything it started: its locks must expire
        // so that the sweep recovers its shards (a heartbeat left running would hold them forever)
        let mut guard =
            AbortGuard { shared: Some(shared.clone()), beat_stop: beat_stop.clone(), closing: closing.clone() };

        let trim_stop = CancellationToken::new();
        let trim = tokio::spawn(crate::starts::trim_loop(shared.clone(), trim_stop.clone()));
        crate::claim::run(shared.clone(), shutdown).await;
        trim_stop.cancel();
        let _ = trim.await;

        // shards claimed ahead and not started: given back at once
        for w in shared.starts.close() {
            crate::run::unstarted(&shared, w.claim, &w.cancel);
        }
        tracker.close();
        let drained = tokio::select! {
            r = tokio::time::timeout(shared.cfg.grace, tracker.wait()) => r.is_ok(),
            _ = now.cancelled() => false,
        };
        if !drained {
            if now.is_cancelled() {
                tracing::info!("stopping at once: releasing shards still running");
            } else {
                tracing::info!("grace time over: releasing shards still running");
            }
            shared.aborting.store(true, Ordering::SeqCst);
            for h in shared.held.lock().unwrap().values() {
                h.cancel.cancel();
            }
            tracker.wait().await;
        }
        // every shard task has sent its report: the reporter flushes them and ends
        closing.cancel();
        if reporter.await.is_err() {
            tracing::error!("reporter task panicked");
        }
        if confirmer.await.is_err() {
            tracing::error!("confirmer task panicked");
        }
        // a claim reply lost just before shutdown: give its shards back now, not after the lease
        if let Err(e) = crate::heartbeat::reconcile(&shared).await {
            tracing::warn!("reconciling held shards at shutdown: {e}");
        }
        beat_stop.cancel();
        let _ = heartbeat.await;
        guard.disarm();
        Ok(shared.stats.snapshot())
    }
}

/// Stops a run whose future was dropped: the heartbeat ends, running handlers are cancelled
/// (and released if the reporter still records them), the reporter drains and ends.
struct AbortGuard {
    /// `None` once the run ended in order.
    shared: Option<Arc<Shared>>,
    beat_stop: CancellationToken,
    closing: CancellationToken,
}

impl AbortGuard {
    fn disarm(&mut self) {
        self.shared = None;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else { return };
        self.beat_stop.cancel();
        shared.aborting.store(true, Ordering::SeqCst);
        for w in shared.starts.close() {
            crate::run::unstarted(&shared, w.claim, &w.cancel);
        }
        if let Ok(held) = shared.held.lock() {
            for h in held.values() {
                h.cancel.cancel();
            }
        }
        self.closing.cancel();
    }
}
