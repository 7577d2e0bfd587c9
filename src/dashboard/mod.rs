//! The coordinator's web dashboard: a page (HTML, script and style embedded in the binary) and
//! the JSON API under `/api/` it reads, documented in docs/dashboard.md. The rules it keeps (what
//! it reads and at what cost, the token, the headers) are in docs/design/dashboard.md.
//!
//! # Layout
//! - `mod.rs`: [`serve`], the listener loop.
//! - `settings.rs`: [`Dashboard`] (its settings) and [`read_token`].
//! - `http.rs`: requests and responses: routing by method and path, the security headers, the
//!   token check, the query string.
//! - `api.rs`: each API endpoint, a read or an action on the queue.
//! - `reply.rs`: what a route answers (status, content type, body), used by both.
//! - `reads.rs`: the shared read cache (one Redis read per request key and second, whatever the
//!   number of viewers).
//! - `assets/`: `index.html`, `app.js`, `app.css`.

mod api;
mod http;
mod reads;
mod reply;
mod settings;

use std::net::SocketAddr;
use std::sync::Arc;

use shardctl_common::{Error, Result};
use tokio_util::sync::CancellationToken;

pub use settings::{read_token, Dashboard};

/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;

/// Binds `addr` (an error names it when it is taken), then serves `dashboard` until `stop`. On a
/// loopback address it answers only requests whose `Host` names loopback with its port (DNS
/// rebinding); elsewhere any.
pub async fn serve(addr: SocketAddr, mut dashboard: Dashboard, stop: CancellationToken) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Error::invalid(format!("the dashboard cannot listen on {addr}: {e} (give another --ui-addr, or off)"))
    })?;
    let local = listener.local_addr().map_err(|e| Error::Unreachable(format!("dashboard listener: {e}")))?;
    if local.ip().is_loopback() {
        let port = local.port();
        dashboard.hosts = Some(vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")]);
    }
    let dashboard = Arc::new(dashboard);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => match s {
                    Ok(s) => s,
                    Err(_) => break,
                },
                () = stop.cancelled() => break,
            };
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("dashboard: accepting a connection: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = stop.cancelled() => break,
            };
            let d = dashboard.clone();
            tokio::spawn(async move {
                http::connection(stream, d).await;
                drop(slot);
            });
        }
    });
    Ok(local)
}
