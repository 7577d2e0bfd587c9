//! The coordinator's web dashboard: a page (HTML, script and style embedded in the binary) and
//! the JSON API under `/api/` it reads, documented in docs/dashboard.md. The rules it keeps (what
//! it reads and at what cost, the token, the headers) are in ARCHITECTURE.md, "Dashboard".
//!
//! # Layout
//! - `mod.rs`: [`Dashboard`] (its settings) and [`serve`], the listener loop.
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

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use shardctl_common::conn::Conn;
use shardctl_common::{Error, Home, Result};
use tokio_util::sync::CancellationToken;

/// A dashboard of one queue.
pub struct Dashboard {
    con: Conn,
    keys: Home,
    /// The action token; `None`: read-only.
    token: Option<String>,
    reads: reads::Reads,
    /// The `Host` values answered (set when listening on loopback); `None`: any.
    hosts: Option<Vec<String>>,
}

impl Dashboard {
    /// A dashboard reading `keys`' queue through `con`; actions need `token` (none: read-only).
    pub fn new(con: Conn, keys: Home, token: Option<String>) -> Self {
        Dashboard { con, keys, token, reads: reads::Reads::new(), hosts: None }
    }

    /// Whether actions are refused (no token configured).
    pub fn read_only(&self) -> bool {
        self.token.is_none()
    }
}

/// Reads the action token from `path`: its first line, at least 16 characters (a token that
/// short is guessable), printable ASCII.
pub fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("cannot read the token file {}: {e}", path.display())))?;
    let token = text.lines().next().map(str::trim).unwrap_or_default();
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(format!(
            "the token file {} must hold a token of at least 16 printable ASCII characters on its first line",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

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
