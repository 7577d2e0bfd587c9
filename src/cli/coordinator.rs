//! `shardctl coordinator`: the maintenance duties and the progress metrics of one queue, until
//! SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_coordinator::daemon::{self, DaemonConfig};
use shardctl_coordinator::sweep::{SweepConfig, DEFAULT_MAX_STALLED};
use tokio_util::sync::CancellationToken;

use super::{connect, duration, Args};

#[derive(Debug, Parser)]
pub struct CoordinatorArgs {
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, default_value = shardctl::metrics::DEFAULT_COORDINATOR_ADDR)]
    pub metrics_addr: SocketAddr,
    /// Time between two readings of the queue's progress (and two promotions and rebalances).
    /// A gauge left unset for three refreshes leaves the output at a following scrape.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub refresh: Duration,
    /// How long a finished task stays in the metrics; past it, its label set leaves the output
    /// (at the second scrape after it, or three refreshes later if scrapes are more frequent).
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub finished_retention: Duration,
    /// How often the full stalled sweep runs (once per interval across all processes): it finds
    /// shards whose holder has no lease at all. A dead executor's shards come back when its lease
    /// expires, whatever this interval.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub stalled_interval: Duration,
    /// Stalls a shard survives; one more fails it.
    #[arg(long, default_value_t = DEFAULT_MAX_STALLED)]
    pub max_stalled_count: u32,
}

pub async fn run(args: &Args, a: &CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let cfg = DaemonConfig {
        refresh: a.refresh,
        finished_retention: a.finished_retention,
        sweep: SweepConfig { interval: a.stalled_interval, max_stalled: a.max_stalled_count },
    };
    cfg.validate().map_err(shardctl_common::Error::Invalid)?;
    let (_, con) = connect(args).await?;
    shardctl::metrics::install(a.metrics_addr, Some(cfg.gauge_idle_timeout()))?;
    let stop = CancellationToken::new();
    shardctl_executor::shutdown::cancel_on_signal(stop.clone());
    tracing::info!(queue = %args.queue, refresh = ?cfg.refresh, retention = ?cfg.finished_retention, "coordinator started");
    daemon::run(con, args.keys()?, cfg, stop).await;
    tracing::info!("coordinator stopped");
    Ok(ExitCode::SUCCESS)
}
