//! `shardctl coordinator`: the maintenance duties and the progress metrics of one queue, until
//! SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_coordinator::daemon::{self, DaemonConfig};
use shardctl_coordinator::sweep::{SweepConfig, DEFAULT_MAX_STALLED};
use tokio_util::sync::CancellationToken;

use super::args::{connect, duration, Args};

#[derive(Debug, Parser)]
pub struct CoordinatorArgs {
    /// Serve Prometheus metrics on this address (GET /metrics); `off` for none. Default
    /// 127.0.0.1:9465 (loopback: give 0.0.0.0:PORT to serve other hosts). When the default is
    /// taken (a second coordinator on the host), it runs without them and says so; an address
    /// given here must be free.
    #[arg(long, value_parser = addr_or_off)]
    pub metrics_addr: Option<MetricsAddr>,
    /// Serve the web dashboard on this address; `off` for none. Default 127.0.0.1:8080
    /// (loopback: give 0.0.0.0:PORT to serve other hosts, then with --ui-token-file and behind a
    /// proxy with TLS). When the default is taken (a second coordinator on the host), it runs
    /// without one and says so; an address given here must be free.
    #[arg(long, value_parser = addr_or_off)]
    pub ui_addr: Option<MetricsAddr>,
    /// Allow the dashboard's actions (pause, resume, cancel, retry) to requests carrying the token
    /// held on this file's first line (at least 16 characters); without it the dashboard is
    /// read-only.
    #[arg(long, value_name = "FILE")]
    pub ui_token_file: Option<std::path::PathBuf>,
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

/// Where the dashboard listens unless told otherwise.
pub const DEFAULT_UI_ADDR: &str = "127.0.0.1:8080";

/// A listener's address (metrics, dashboard), or none (`off`).
#[derive(Debug, Clone, Copy)]
pub struct MetricsAddr(Option<SocketAddr>);

fn addr_or_off(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse().map(|a| MetricsAddr(Some(a))).map_err(|e| format!("'{s}': {e} (an address like 127.0.0.1:9465, or off)"))
}

pub async fn run(args: &Args, a: &CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let cfg = DaemonConfig {
        refresh: a.refresh,
        finished_retention: a.finished_retention,
        sweep: SweepConfig { interval: a.stalled_interval, max_stalled: a.max_stalled_count },
    };
    cfg.validate().map_err(shardctl_common::Error::Invalid)?;
    let token = a.ui_token_file.as_deref().map(shardctl::dashboard::read_token).transpose()?;
    let (_, con) = connect(args).await?;
    let metrics = a
        .metrics_addr
        .unwrap_or(MetricsAddr(Some(shardctl::metrics::DEFAULT_COORDINATOR_ADDR.parse().expect("an address"))));
    if let MetricsAddr(Some(addr)) = metrics {
        match shardctl::metrics::install(addr, Some(cfg.gauge_idle_timeout())) {
            Ok(()) => {}
            Err(e) if a.metrics_addr.is_none() => {
                tracing::warn!("no metrics: {e} (another coordinator on this host? --metrics-addr picks an address)")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let (stop, now) = (CancellationToken::new(), CancellationToken::new());
    let ui = a.ui_addr.unwrap_or(MetricsAddr(Some(DEFAULT_UI_ADDR.parse().expect("an address"))));
    if let MetricsAddr(Some(addr)) = ui {
        let read_only = token.is_none();
        let dashboard = shardctl::dashboard::Dashboard::new(con.clone(), args.keys()?, token);
        match shardctl::dashboard::serve(addr, dashboard, stop.clone()).await {
            Ok(at) => {
                let how = if read_only { "read-only: no --ui-token-file" } else { "actions need the token" };
                tracing::info!("dashboard on http://{at}/ ({how})");
            }
            Err(e) if a.ui_addr.is_none() => {
                tracing::warn!("no dashboard: {e} (another coordinator on this host? --ui-addr picks an address)")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let what = "the round of upkeep under way (sweep, promotions, rebalance, schedule firing) ends, \
                then this coordinator leaves the coordinators set";
    shardctl_executor::shutdown::cancel_on_signals(stop.clone(), now.clone(), what.to_owned());
    tracing::info!(queue = %args.queue, refresh = ?cfg.refresh, retention = ?cfg.finished_retention, "coordinator started");
    let lapse = shardctl_coordinator::presence::lifetime(cfg.refresh);
    tokio::select! {
        () = daemon::run(con, args.keys()?, cfg, stop) => tracing::info!("coordinator stopped"),
        () = now.cancelled() => tracing::warn!(
            "coordinator stopped at once: its entry in the coordinators set lapses within {}",
            humantime::format_duration(lapse)
        ),
    }
    Ok(ExitCode::SUCCESS)
}
