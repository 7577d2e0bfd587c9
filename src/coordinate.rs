//! [`Coordinator`]: one `shardctl coordinator` process of a queue, assembled: the daemon's upkeep
//! every refresh (sweep, promotions, rebalance, schedules, progress), the Prometheus exporter of
//! its progress and the web dashboard, each on its own address, until SIGINT or SIGTERM.

use std::net::SocketAddr;

use shardctl_common::conn::Conn;
use shardctl_common::{Error, Home, Result};
use shardctl_coordinator::daemon::{self, DaemonConfig};
use tokio_util::sync::CancellationToken;

/// Where the dashboard listens unless told otherwise.
pub const DEFAULT_UI_ADDR: &str = "127.0.0.1:8080";

/// Where a listener of the coordinator (metrics, dashboard) listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Nowhere.
    Off,
    /// At the default address; when it is taken (a second coordinator on the host) the
    /// coordinator runs without this listener and says so.
    Default(SocketAddr),
    /// At this address, which must be free.
    At(SocketAddr),
}

/// What a coordinator runs.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The upkeep's settings.
    pub daemon: DaemonConfig,
    /// The Prometheus exporter (`GET /metrics`).
    pub metrics: Listen,
    /// The web dashboard.
    pub dashboard: Listen,
    /// The token that allows the dashboard's actions; without it the dashboard is read-only.
    pub ui_token: Option<String>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        let at = |a: &str| Listen::Default(a.parse().expect("an address"));
        CoordinatorConfig {
            daemon: DaemonConfig::default(),
            metrics: at(crate::metrics::DEFAULT_COORDINATOR_ADDR),
            dashboard: at(DEFAULT_UI_ADDR),
            ui_token: None,
        }
    }
}

/// A coordinator, its settings checked.
pub struct Coordinator {
    cfg: CoordinatorConfig,
}

impl Coordinator {
    /// A coordinator of these settings, refused when they are not sound (before anything
    /// connects).
    pub fn new(cfg: CoordinatorConfig) -> Result<Coordinator> {
        cfg.daemon.validate().map_err(Error::Invalid)?;
        Ok(Coordinator { cfg })
    }

    /// Coordinates queue `home` on `con` until SIGINT or SIGTERM: the round of upkeep under way
    /// ends, then the coordinator leaves the coordinators set; at a second signal it stops at
    /// once.
    pub async fn run_until_signal(self, con: Conn, home: Home) -> Result<()> {
        let cfg = self.cfg;
        let taken = |what: &str, e: &Error, flag: &str| {
            tracing::warn!("no {what}: {e} (another coordinator on this host? {flag} picks an address)")
        };
        match cfg.metrics {
            Listen::Off => {}
            Listen::Default(addr) => {
                if let Err(e) = crate::metrics::install(addr, Some(cfg.daemon.gauge_idle_timeout())) {
                    taken("metrics", &e, "--metrics-addr");
                }
            }
            Listen::At(addr) => crate::metrics::install(addr, Some(cfg.daemon.gauge_idle_timeout()))?,
        }
        let (stop, now) = (CancellationToken::new(), CancellationToken::new());
        if let Listen::Default(addr) | Listen::At(addr) = cfg.dashboard {
            let read_only = cfg.ui_token.is_none();
            let dashboard = crate::dashboard::Dashboard::new(con.clone(), home.clone(), cfg.ui_token.clone());
            match crate::dashboard::serve(addr, dashboard, stop.clone()).await {
                Ok(at) => {
                    let how = if read_only { "read-only: no --ui-token-file" } else { "actions need the token" };
                    tracing::info!("dashboard on http://{at}/ ({how})");
                }
                Err(e) if matches!(cfg.dashboard, Listen::Default(_)) => taken("dashboard", &e, "--ui-addr"),
                Err(e) => return Err(e),
            }
        }
        let what = "the round of upkeep under way (sweep, promotions, rebalance, schedule firing) ends, \
                    then this coordinator leaves the coordinators set";
        shardctl_executor::shutdown::cancel_on_signals(stop.clone(), now.clone(), what.to_owned());
        let d = &cfg.daemon;
        tracing::info!(queue = %home.queue(), refresh = ?d.refresh, retention = ?d.finished_retention, "coordinator started");
        let lapse = shardctl_coordinator::presence::lifetime(d.refresh);
        tokio::select! {
            () = daemon::run(con, home, cfg.daemon, stop) => tracing::info!("coordinator stopped"),
            () = now.cancelled() => tracing::warn!(
                "coordinator stopped at once: its entry in the coordinators set lapses within {}",
                humantime::format_duration(lapse)
            ),
        }
        Ok(())
    }
}
