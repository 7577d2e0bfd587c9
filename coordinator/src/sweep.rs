//! Maintenance that any process may run: the stalled sweep, throttled in Redis so that one
//! sweep runs per interval however many processes call it, and after each sweep the removal of
//! ended tasks whose retention ran out. What the sweeps of this process
//! recovered and failed is counted in [`crate::metrics`].

use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::scripts::{self, SweepReport};
use shardctl_common::Keys;
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

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig { interval: DEFAULT_STALLED_INTERVAL, max_stalled: DEFAULT_MAX_STALLED }
    }
}

/// Runs the sweep every interval until `stop`; `on_report` sees each sweep that ran.
pub async fn run(
    mut con: Conn,
    keys: Keys,
    cfg: SweepConfig,
    stop: CancellationToken,
    on_report: impl Fn(SweepReport) + Send,
) {
    let interval = cfg.interval.max(Duration::from_millis(10));
    let m = crate::metrics::SweepMetrics::new(keys.queue());
    loop {
        match scripts::sweep(&mut con, &keys, interval.as_millis() as u64, cfg.max_stalled).await {
            Ok(Some(r)) => {
                m.recovered.increment(r.recovered);
                m.failed.increment(r.failed);
                if r.recovered + r.failed > 0 {
                    tracing::info!(recovered = r.recovered, failed = r.failed, "stalled sweep");
                }
                on_report(r);
                match shardctl_common::control::clean(&mut con, &keys, None).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(removed = n, "removed ended tasks past their retention"),
                    Err(e) => tracing::warn!("removing expired tasks failed: {e}"),
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("stalled sweep failed: {e}"),
        }
        // a little jitter keeps many executors from calling at the same instant
        let jitter = Duration::from_millis(u64::from(uuid::Uuid::new_v4().as_u128() as u16 % 50));
        tokio::select! {
            _ = tokio::time::sleep(interval + jitter) => {}
            _ = stop.cancelled() => return,
        }
    }
}
