//! The coordinator daemon (`shardctl coordinator`): one long-running process per queue that does
//! the maintenance duties beside the executors (the stalled sweep, promotion of due retries,
//! re-routing and failover) and reads the queue's progress from Redis every refresh for the
//! Prometheus gauges of [`crate::metrics`].
//!
//! None of it is needed for correctness: executors sweep, promote and rebalance too. The daemon
//! keeps those duties going while every executor is busy, asleep or gone, and it is the one place
//! that exports task progress (executors only export what they did).
//!
//! Which tasks are exported: the running ones (`running`) and those finished within the retention
//! (`finished`, by end time). A task past its retention is no longer set, and the exporter drops
//! its gauges after their idle timeout ([`DaemonConfig::gauge_idle_timeout`]), so the label sets
//! stay bounded by the running tasks plus the tasks of one retention.

use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::time::now_ms;
use shardctl_common::{scripts, Home};
use tokio_util::sync::CancellationToken;

use crate::rebalance;
use crate::sweep::{self, SweepConfig};

/// Default time between two readings (and between two promotions and rebalances).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(2);
/// Default time a finished task stays in the metrics.
pub const DEFAULT_FINISHED_RETENTION: Duration = Duration::from_secs(5 * 60);
/// Idle timeout of the exported gauges, in refreshes.
pub const IDLE_REFRESHES: u32 = 3;

/// Settings of the daemon.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Time between two readings, promotions and rebalances.
    pub refresh: Duration,
    /// How long a finished task stays in the metrics.
    pub finished_retention: Duration,
    /// The stalled sweep.
    pub sweep: SweepConfig,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            refresh: DEFAULT_REFRESH,
            finished_retention: DEFAULT_FINISHED_RETENTION,
            sweep: SweepConfig::default(),
        }
    }
}

impl DaemonConfig {
    /// Checks the settings.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.refresh < Duration::from_millis(10) {
            return Err(format!("refresh ({:?}) must be at least 10ms", self.refresh));
        }
        Ok(())
    }

    /// How long the exporter keeps a gauge that is no longer set: [`IDLE_REFRESHES`] refreshes,
    /// so a slow refresh never drops a live series, and a finished task's disappears soon after
    /// its retention.
    pub fn gauge_idle_timeout(&self) -> Duration {
        self.refresh * IDLE_REFRESHES
    }
}

/// Runs the daemon until `stop`: the stalled sweep on its own interval, the cron schedules at
/// their fire times; promotion, rebalancing
/// and a reading published to the gauges every refresh. Redis errors are logged and the next
/// refresh tries again (meanwhile the gauges age out: a silent daemon exports nothing stale).
pub async fn run(mut con: Conn, home: Home, cfg: DaemonConfig, stop: CancellationToken) {
    let mut sweepers =
        vec![tokio::spawn(sweep::run(con.clone(), home.clone(), cfg.sweep.clone(), stop.clone(), |_| {}))];
    // a partitioned queue: each partition's sweep, and the reports of ended shares to the home
    sweepers.push(tokio::spawn(crate::partition::upkeep(con.clone(), home.clone(), cfg.sweep.clone(), stop.clone())));
    let firing = tokio::spawn(crate::firing::run(con.clone(), home.clone(), stop.clone()));
    let mut tick = tokio::time::interval(cfg.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
        if let Err(e) = crate::presence::announce(&mut con, &home, cfg.refresh).await {
            tracing::warn!("announcing this coordinator: {e}");
        }
        refresh(&mut con, &home, &cfg).await;
    }
    let _ = crate::presence::withdraw(&mut con, &home).await;
    for s in sweepers {
        let _ = s.await;
    }
    let _ = firing.await;
}

async fn refresh(con: &mut Conn, home: &Home, cfg: &DaemonConfig) {
    match scripts::promote(con, home).await {
        Ok(n) if n > 0 => tracing::debug!(promoted = n, "due retries promoted"),
        Ok(_) => {}
        Err(e) => tracing::warn!("promoting due retries: {e}"),
    }
    match rebalance::rebalance(con, home).await {
        Ok(Some(r)) if r.changed() => r.log(),
        Ok(_) => {}
        Err(e) => tracing::warn!("rebalance failed: {e}"),
    }
    match crate::snapshot::snapshot(con, home, now_ms(), cfg.finished_retention).await {
        Ok(s) => crate::metrics::publish(home.queue(), &s),
        Err(e) => tracing::warn!("reading progress: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_gauges_outlive_three_refreshes() {
        let c = DaemonConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.gauge_idle_timeout(), Duration::from_secs(6));
        assert!(DaemonConfig { refresh: Duration::from_millis(1), ..c }.validate().is_err());
    }
}
