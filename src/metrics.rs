//! The Prometheus exporter of a [`crate::Node`] (`executor --metrics-addr`) and of `shardctl
//! coordinator`: an HTTP listener that answers `GET /metrics` in the Prometheus text format, with
//! every metric of the library crates described and their `_seconds` histograms rendered as
//! histograms (buckets), not summaries. One per process (the metrics recorder is global).

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;
use shardctl_common::{Error, Result};

/// Default address of the coordinator's endpoint: loopback (serving the network is a choice),
/// and not 9464, the port the docs give executors, so that both run on one host as written.
pub const DEFAULT_COORDINATOR_ADDR: &str = "127.0.0.1:9465";

/// Installs the exporter on `addr` for the rest of the process. `idle_gauges`: gauges not set for
/// that long leave the output (how the coordinator drops finished tasks).
pub fn install(addr: SocketAddr, idle_gauges: Option<Duration>) -> Result<()> {
    let mut b = PrometheusBuilder::new().with_http_listener(addr);
    for (name, bounds) in shardctl_executor::metrics::buckets() {
        b = b
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), bounds)
            .map_err(|e| Error::Invalid(format!("histogram buckets of {name}: {e}")))?;
    }
    if let Some(idle) = idle_gauges {
        b = b.idle_timeout(MetricKindMask::GAUGE, Some(idle));
    }
    b.install().map_err(|e| Error::Unreachable(format!("cannot serve metrics on {addr}: {e}")))?;
    shardctl_executor::metrics::describe();
    shardctl_coordinator::metrics::describe();
    tracing::info!("metrics on http://{addr}/metrics");
    Ok(())
}
