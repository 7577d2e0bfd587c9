//! The Prometheus exporter of `executor --metrics-addr` and `coordinator`: an HTTP listener that
//! answers `GET /metrics` in the Prometheus text format, with every metric of the library crates
//! described and their `_seconds` histograms rendered as histograms (buckets), not summaries.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;

/// Default address of the coordinator's endpoint.
pub const DEFAULT_COORDINATOR_ADDR: &str = "0.0.0.0:9464";

/// Installs the exporter on `addr` for the rest of the process. `idle_gauges`: gauges not set for
/// that long leave the output (how the coordinator drops finished tasks).
pub fn install(addr: SocketAddr, idle_gauges: Option<Duration>) -> anyhow::Result<()> {
    let mut b = PrometheusBuilder::new().with_http_listener(addr);
    for (name, bounds) in shardctl_executor::metrics::buckets() {
        b = b.set_buckets_for_metric(Matcher::Full(name.to_owned()), bounds).context("histogram buckets")?;
    }
    if let Some(idle) = idle_gauges {
        b = b.idle_timeout(MetricKindMask::GAUGE, Some(idle));
    }
    b.install().with_context(|| format!("cannot serve metrics on {addr}"))?;
    shardctl_executor::metrics::describe();
    shardctl_coordinator::metrics::describe();
    tracing::info!("metrics on http://{addr}/metrics");
    Ok(())
}
