//! Maintenance that any process may run: the stalled sweep, and after each sweep that ran the
//! removal of ended tasks whose retention ran out. The loop calls the sweep when the earliest
//! executor lease expires (the script says when), at least every [`LEASE_CHECK`], so a dead
//! executor's shards come back within a moment of its lease running out; the full sweep inside it
//! is throttled in Redis to once per interval however many processes call. What the sweeps of
//! this process recovered and failed is counted in [`crate::metrics`].

use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::scripts::{self, SweepReport};
use shardctl_common::{Home, Keys};
use tokio_util::sync::CancellationToken;

/// Settings of the maintenance loop.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// How often the sweep runs (across all processes).
    pub interval: Duration,
    /// Stalls a shard survives; one more fails it.
    pub max_stalled: u32,
}

/// Default sweep interval.
pub const DEFAULT_STALLED_INTERVAL: Duration = Duration::from_secs(30);
/// Default stalls a shard survives.
pub const DEFAULT_MAX_STALLED: u32 = 1;
/// Longest the loop sleeps between two calls: a lease taken while it slept with an expiry before
/// the one it was told of is found at most this late.
pub const LEASE_CHECK: Duration = Duration::from_secs(1);

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig { interval: DEFAULT_STALLED_INTERVAL, max_stalled: DEFAULT_MAX_STALLED }
    }
}

/// Runs the sweep of the queue's home until `stop`, at each lease expiry and at least every
/// [`LEASE_CHECK`] (the full sweep once per interval); `on_report` sees each sweep that ran.
/// Each full sweep also removes the ended tasks past their retention, with their shares.
pub async fn run(
    con: Conn,
    home: Home,
    cfg: SweepConfig,
    stop: CancellationToken,
    on_report: impl Fn(SweepReport) + Send,
) {
    run_in(con, home.keys().clone(), Some(home), cfg, stop, on_report).await
}

/// [`run`] in one partition of a queue: its ended share records past their retention go.
pub async fn run_partition(con: Conn, partition: Keys, cfg: SweepConfig, stop: CancellationToken) {
    run_in(con, partition, None, cfg, stop, |_| {}).await
}

async fn run_in(
    mut con: Conn,
    keys: Keys,
    home: Option<Home>,
    cfg: SweepConfig,
    stop: CancellationToken,
    on_report: impl Fn(SweepReport) + Send,
) {
    let interval = cfg.interval.max(Duration::from_millis(10));
    let m = crate::metrics::SweepMetrics::new(keys.queue());
    loop {
        let mut next = None;
        match scripts::sweep(&mut con, &keys, interval.as_millis() as u64, cfg.max_stalled).await {
            Ok(sweep) => {
                next = sweep.next_expiry_in_ms.map(Duration::from_millis);
                if let Some(r) = sweep.report {
                    m.recovered.increment(r.recovered);
                    m.failed.increment(r.failed);
                    if r.recovered + r.failed > 0 {
                        tracing::info!(recovered = r.recovered, failed = r.failed, "stalled sweep");
                    }
                    on_report(r);
                    // an older version's queue (docs/design/lanes.md): into lanes
                    match scripts::move_legacy(&mut con, &keys).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(moved = n, "moved refs and tasks queued by an older version to their lanes")
                        }
                        Err(e) => tracing::warn!("moving an older version's queue failed: {e}"),
                    }
                    let removed = match &home {
                        Some(home) => shardctl_common::control::clean(&mut con, home, None).await,
                        None => shardctl_common::control::clean_in(&mut con, &keys, None).await,
                    };
                    match removed {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(removed = n, "removed ended tasks past their retention"),
                        Err(e) => tracing::warn!("removing expired tasks failed: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("stalled sweep failed: {e}"),
        }
        // a little jitter keeps many processes from calling at the same instant; the first to
        // call after an expiry recovers the shards, the others find nothing to do
        let jitter = Duration::from_millis(1 + (shardctl_common::backoff::jitter01() * 20.0) as u64);
        let sleep = next.unwrap_or(LEASE_CHECK).min(LEASE_CHECK).min(interval) + jitter;
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = stop.cancelled() => return,
        }
    }
}
