//! [`Node`]: one executor node, assembled from a handler [`Registry`] and a [`NodeConfig`]: the
//! executor runtime, its membership (join, heartbeat, failover and rebalancing after each beat),
//! the stalled sweep beside it (so that a crashed peer's shards come back with no other process
//! running), the Prometheus exporter if asked, and the graceful shutdown (running shards drain
//! for the grace time, the rest are given back, the node leaves and its routed list moves on).
//! A change of the queue's partitions re-forms the runtimes: the same drain, without leaving
//! (docs/design/partitions-repair.md).

use std::net::SocketAddr;
use std::sync::Arc;

use shardctl_common::conn::{self, Conn, Endpoint};
use shardctl_common::partition::{Layout, LAYOUT_CHECK};
use shardctl_common::{Error, Home, Result};
use shardctl_coordinator::membership::{self, Member, MembershipConfig};
use shardctl_coordinator::sweep::{self, SweepConfig};
use shardctl_executor::{Executor, ExecutorConfig, Registry, Sharing, Stats, StatsSnapshot, With};
use tokio_util::sync::CancellationToken;

/// The key prefix of every command and of [`Node::connect`].
pub const DEFAULT_PREFIX: &str = "shardctl";

/// Everything a node is configured with; the defaults are `shardctl executor`'s.
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// The executor runtime: node id, concurrency, locks, grace time.
    pub executor: ExecutorConfig,
    /// Membership heartbeat and timeout.
    pub membership: MembershipConfig,
    /// The stalled sweep run beside the executor.
    pub sweep: SweepConfig,
    /// Serve Prometheus metrics here (`GET /metrics`); `None`: no listener.
    pub metrics_addr: Option<SocketAddr>,
}

/// An executor node that has joined its queue's membership; [`Node::run`] runs it.
pub struct Node {
    /// The runtimes of the layout it started with.
    runtimes: Runtimes,
    layout: Layout,
    /// What a re-formed set of runtimes is built from (a change of the queue's partitions).
    build: Build,
    con: Conn,
    home: Home,
    member: Member,
    membership: MembershipConfig,
    sweep: SweepConfig,
    redis: String,
    grace: std::time::Duration,
}

/// What a node's runtimes are built from, kept for a change of the queue's layout.
#[derive(Clone)]
struct Build {
    endpoint: Endpoint,
    home: Home,
    config: ExecutorConfig,
    registry: Registry,
    /// The node's counters, kept across re-formed runtimes.
    stats: Arc<Stats>,
}

/// The executor runtimes of one layout: the home's alone, or on a partitioned queue one per
/// keyspace (the home for aggregation jobs, each partition) sharing the run slots, the
/// counters, and on one server one blocking connection (docs/design/partitions.md).
struct Runtimes {
    home: Executor,
    partitions: Vec<Executor>,
    /// What the runtimes of a partitioned queue share, with the endpoint and block timeout of
    /// their common blocking connection.
    sharing: Option<(Sharing, Endpoint, std::time::Duration)>,
}

impl Build {
    async fn runtimes(&self, layout: &Layout) -> Result<Runtimes> {
        let Build { endpoint, home, config, registry, stats } = self;
        if !layout.partitioned() {
            let with = With::Stats(stats.clone());
            let home =
                Executor::connect_in(endpoint.clone(), home.clone(), None, config.clone(), registry.clone(), with)
                    .await?;
            return Ok(Runtimes { home, partitions: Vec::new(), sharing: None });
        }
        let with = Sharing::counting(config.concurrency, endpoint, stats.clone());
        let in_home = Executor::connect_in(
            endpoint.clone(),
            home.clone(),
            None,
            config.clone(),
            registry.clone(),
            With::Sharing(&with),
        )
        .await?;
        let mut partitions = Vec::new();
        for pk in &layout.partitions {
            partitions.push(
                Executor::connect_in(
                    endpoint.clone(),
                    home.clone(),
                    Some(pk.clone()),
                    config.clone(),
                    registry.clone(),
                    With::Sharing(&with),
                )
                .await?,
            );
        }
        Ok(Runtimes { home: in_home, partitions, sharing: Some((with, endpoint.clone(), config.block_timeout)) })
    }
}

impl Runtimes {
    /// Runs every runtime until `shutdown`, then their drains; the node's counters, or the first
    /// runtime's error. Each runtime's call for a rebalance is passed on to `routing`.
    async fn run(
        self,
        shutdown: CancellationToken,
        now: CancellationToken,
        routing: &Arc<tokio::sync::Notify>,
    ) -> Result<StatsSnapshot> {
        let Runtimes { home, partitions, sharing } = self;
        let waiting = CancellationToken::new();
        let waiter = sharing.map(|(with, endpoint, block)| {
            let waiting = waiting.clone();
            tokio::spawn(async move { with.wait_for_all(endpoint, block, waiting).await })
        });
        let mut forwards = Vec::new();
        let mut runs = Vec::new();
        for e in std::iter::once(home).chain(partitions) {
            let (from, to) = (e.routing_wanted(), routing.clone());
            forwards.push(tokio::spawn(async move {
                loop {
                    from.notified().await;
                    to.notify_one();
                }
            }));
            runs.push(tokio::spawn(e.run_until(shutdown.clone(), now.clone())));
        }
        // every runtime shares one set of counters: the first's snapshot is the node's
        let mut ran = None;
        for r in runs {
            let r = r.await.unwrap_or_else(|e| Err(Error::Protocol(format!("executor runtime panicked: {e}"))));
            if ran.as_ref().is_none_or(|x: &Result<StatsSnapshot>| x.is_ok()) {
                ran = Some(r);
            }
        }
        for f in forwards {
            f.abort();
        }
        waiting.cancel();
        if let Some(w) = waiter {
            let _ = w.await;
        }
        ran.expect("the home runtime ran")
    }
}

/// Cancels `epoch` once the queue's layout is no longer `layout` (read every
/// [`LAYOUT_CHECK`]), unless `epoch` ends first.
async fn watch_layout(mut con: Conn, home: Home, layout: Layout, epoch: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LAYOUT_CHECK) => {}
            _ = epoch.cancelled() => return,
        }
        match shardctl_common::partition::layout(&mut con, &home).await {
            Ok(now) if now != layout => {
                tracing::info!(
                    from = layout.count(),
                    to = now.count(),
                    "the queue's partitions changed: stopping to claim, re-forming the runtimes once running shards end"
                );
                epoch.cancel();
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("reading the queue's partitions: {e}"),
        }
    }
}

impl Node {
    /// Connects to the Redis at `url` and joins queue `queue` (prefix [`DEFAULT_PREFIX`]); see
    /// [`Node::start`].
    pub async fn connect(url: &str, queue: &str, config: NodeConfig, registry: Registry) -> Result<Node> {
        Node::start(conn::open(url)?, Home::new(DEFAULT_PREFIX, queue)?, config, registry).await
    }

    /// Validates the config, connects, and joins the membership: refused
    /// ([`Error::Refused`] with [`ScriptCode::NodeAlive`](shardctl_common::ScriptCode::NodeAlive))
    /// while another live executor holds the node id.
    pub async fn start(endpoint: Endpoint, home: Home, config: NodeConfig, registry: Registry) -> Result<Node> {
        config.executor.validate().map_err(Error::Invalid)?;
        config.membership.validate().map_err(Error::Invalid)?;
        // before joining: a node that cannot serve its metrics must not leave a member entry
        // behind (its node id would look live for the member timeout)
        if let Some(addr) = config.metrics_addr {
            crate::metrics::install(addr, None)?;
        }
        let mut con = endpoint.manager().await?;
        let stats = Arc::new(Stats::default());
        let member = Member {
            node: config.executor.node_id.clone(),
            instance: config.executor.instance.clone(),
            host: shardctl_executor::config::hostname(),
            pid: std::process::id(),
            concurrency: config.executor.concurrency,
            kinds: registry.served().to_string(),
            live: Some(live_fields(stats.clone())),
        };
        membership::join(&mut con, &home, &member, &config.membership).await?;
        shardctl_common::queues::register(&mut con, &home).await;
        let redis = endpoint.redacted().to_owned();
        let grace = config.executor.grace;
        let layout = shardctl_common::partition::layout(&mut con, &home).await?;
        let build = Build { endpoint, home: home.clone(), config: config.executor, registry, stats };
        let runtimes = build.runtimes(&layout).await?;
        Ok(Node {
            runtimes,
            layout,
            build,
            con,
            home,
            member,
            membership: config.membership,
            sweep: config.sweep,
            redis,
            grace,
        })
    }

    /// The node id it runs as.
    pub fn node_id(&self) -> &str {
        &self.member.node
    }

    /// Live counters of its executor.
    pub fn stats(&self) -> Arc<Stats> {
        self.build.stats.clone()
    }

    /// Runs until SIGINT or SIGTERM, then shuts down as [`Node::run`] does; a second signal
    /// during the drain stops at once (the shards still running are released).
    pub async fn run_until_signal(self) -> Result<StatsSnapshot> {
        let (shutdown, now) = (CancellationToken::new(), CancellationToken::new());
        let what = format!("running shards get up to {:?} to finish, then are given back", self.grace);
        shardctl_executor::shutdown::cancel_on_signals(shutdown.clone(), now.clone(), what);
        self.run_until(shutdown, now).await
    }

    /// Runs until `shutdown` is cancelled (or another executor takes the node id over: an
    /// [`Error::Refused`] then), then drains, leaves the membership and rebalances.
    pub async fn run(self, shutdown: CancellationToken) -> Result<StatsSnapshot> {
        self.run_until(shutdown, CancellationToken::new()).await
    }

    /// [`Node::run`], where cancelling `now` during the drain stops at once.
    pub async fn run_until(self, shutdown: CancellationToken, now: CancellationToken) -> Result<StatsSnapshot> {
        let Node { runtimes, layout, build, mut con, home, member, membership, sweep, redis, .. } = self;
        let routing_wanted = Arc::new(tokio::sync::Notify::new());
        let stop = CancellationToken::new();
        // the home's sweep; each partition's sweep and the reports of ended shares to the home,
        // following the layout
        let sweepers = vec![
            tokio::spawn(sweep::run(con.clone(), home.clone(), sweep.clone(), stop.clone(), |_| {})),
            tokio::spawn(shardctl_coordinator::partition::upkeep(con.clone(), home.clone(), sweep, stop.clone())),
        ];
        let members = {
            let (con, home, member, stop, shutdown) =
                (con.clone(), home.clone(), member.clone(), stop.clone(), shutdown.clone());
            let routing_wanted = routing_wanted.clone();
            tokio::spawn(async move {
                let r = membership::run(con, home, member, membership, stop, routing_wanted, |_| {}).await;
                if r.is_err() {
                    // another executor took our node id over: stop claiming as that node
                    shutdown.cancel();
                }
                r
            })
        };
        tracing::info!(node = %member.node, queue = %home.queue(), %redis, partitions = layout.count(), "executor started");
        // one epoch per layout: a change of the queue's partitions ends it (the runtimes drain as
        // at shutdown, but the node stays a member) and the next runs the new layout's runtimes
        let (mut runtimes, mut layout) = (Some(runtimes), layout);
        let ran = loop {
            let Some(current) = runtimes.take() else { break Ok(build.stats.snapshot()) };
            let epoch = shutdown.child_token();
            let watcher = tokio::spawn(watch_layout(con.clone(), home.clone(), layout.clone(), epoch.clone()));
            let r = current.run(epoch.clone(), now.clone(), &routing_wanted).await;
            epoch.cancel();
            let _ = watcher.await;
            if r.is_err() || shutdown.is_cancelled() {
                break r;
            }
            // the layout changed: the next epoch's runtimes, once they can be built
            while runtimes.is_none() && !shutdown.is_cancelled() {
                let next = match shardctl_common::partition::layout(&mut con, &home).await {
                    Ok(l) => build.runtimes(&l).await.map(|r| (r, l)),
                    Err(e) => Err(e),
                };
                match next {
                    Ok((r, l)) => {
                        tracing::info!(partitions = l.count(), "runtimes re-formed for the queue's partitions");
                        (runtimes, layout) = (Some(r), l);
                    }
                    Err(e) => {
                        tracing::warn!("re-forming the runtimes: {e}");
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                            _ = shutdown.cancelled() => {}
                        }
                    }
                }
            }
        };
        stop.cancel();
        for s in sweepers {
            let _ = s.await;
        }
        let taken_over = members.await.map(|r| r.err()).unwrap_or(None);
        if taken_over.is_none() {
            // our routed list moves to the remaining executors at their next rebalance
            if let Err(e) = membership::leave(&mut con, &home, &member).await {
                tracing::warn!("leaving the membership: {e}");
            }
            let _ = shardctl_coordinator::rebalance::rebalance(&mut con, &home).await;
        }
        let stats = ran?;
        tracing::info!(
            claimed = stats.claimed,
            completed = stats.completed,
            failed = stats.failed,
            retried = stats.retried,
            released = stats.released,
            locks_lost = stats.locks_lost,
            cancelled = stats.cancelled,
            refused = stats.refused,
            duplicates = stats.duplicates,
            aggregated = stats.aggregated,
            redis_errors = stats.redis_errors,
            with_claim = stats.with_claim,
            "executor stopped"
        );
        match taken_over {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }
}

/// The running shards each heartbeat names, longest running first.
const LONGEST_RUNNING: usize = 10;

/// What this executor says of itself at each membership heartbeat (docs/design/dashboard.md,
/// "Executors"): for how long it has counted, the shards it completed and failed for good, and
/// the shards it has held longest (`<task> <index> <ms held>`, comma-separated; by its own
/// monotonic clock).
fn live_fields(stats: Arc<Stats>) -> shardctl_coordinator::membership::LiveFields {
    // its counts run from here, whatever happens to its node's record (a reap, a failover)
    let since = std::time::Instant::now();
    shardctl_coordinator::membership::LiveFields(Arc::new(move || {
        let s = stats.snapshot();
        let running: Vec<String> = stats
            .longest_running(LONGEST_RUNNING)
            .into_iter()
            .map(|(task, index, ms)| format!("{task} {index} {ms}"))
            .collect();
        vec![
            ("live_up_ms", since.elapsed().as_millis().to_string()),
            ("live_done", s.completed.to_string()),
            ("live_failed", s.failed.to_string()),
            ("live_running", running.join(",")),
        ]
    }))
}
