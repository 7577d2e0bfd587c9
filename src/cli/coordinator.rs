//! `shardctl coordinator`: the maintenance duties and the progress metrics of one queue, until
//! SIGINT or SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl::coordinate::{Coordinator, CoordinatorConfig, Listen};
use shardctl_coordinator::daemon::DaemonConfig;
use shardctl_coordinator::sweep::{SweepConfig, DEFAULT_MAX_STALLED};

use super::args::{connect, duration, Args};

#[derive(Debug, Parser)]
pub struct CoordinatorArgs {
    /// Serve Prometheus metrics on this address (GET /metrics); `off` for none. Default
    /// 127.0.0.1:9465 (loopback: give 0.0.0.0:PORT to serve other hosts). When the default is
    /// taken (a second coordinator on the host), it runs without them and says so; an address
    /// given here must be free.
    #[arg(long, value_parser = addr_or_off)]
    pub metrics_addr: Option<Listen>,
    /// Serve the web dashboard on this address; `off` for none. Default 127.0.0.1:8080
    /// (loopback: give 0.0.0.0:PORT to serve other hosts, then with --ui-token-file and behind a
    /// proxy with TLS). When the default is taken (a second coordinator on the host), it runs
    /// without one and says so; an address given here must be free.
    #[arg(long, value_parser = addr_or_off)]
    pub ui_addr: Option<Listen>,
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

fn addr_or_off(s: &str) -> Result<Listen, String> {
    if s == "off" {
        return Ok(Listen::Off);
    }
    s.parse().map(Listen::At).map_err(|e| format!("'{s}': {e} (an address like 127.0.0.1:9465, or off)"))
}

pub async fn run(args: &Args, a: &CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let defaults = CoordinatorConfig::default();
    let cfg = CoordinatorConfig {
        daemon: DaemonConfig {
            refresh: a.refresh,
            finished_retention: a.finished_retention,
            sweep: SweepConfig { interval: a.stalled_interval, max_stalled: a.max_stalled_count },
        },
        metrics: a.metrics_addr.unwrap_or(defaults.metrics),
        dashboard: a.ui_addr.unwrap_or(defaults.dashboard),
        ui_token: a.ui_token_file.as_deref().map(shardctl::dashboard::read_token).transpose()?,
    };
    let coordinator = Coordinator::new(cfg)?;
    let (_, con) = connect(args).await?;
    coordinator.run_until_signal(con, args.home()?).await?;
    Ok(ExitCode::SUCCESS)
}
