//! Turns SIGINT (ctrl-c) and SIGTERM into the cancellation of a token; with
//! [`cancel_on_signals`], a second signal cancels another (stop at once).

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGINT or SIGTERM.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                let _ = ctrl_c.await;
                token.cancel();
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => tracing::info!("SIGINT: shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        token.cancel();
    });
}

/// Cancels `graceful` on the first SIGINT or SIGTERM, saying what a shutdown waits for (`what`)
/// and that a second signal stops at once; cancels `now` on the second.
pub fn cancel_on_signals(graceful: CancellationToken, now: CancellationToken, what: String) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                let _ = tokio::signal::ctrl_c().await;
                graceful.cancel();
                let _ = tokio::signal::ctrl_c().await;
                now.cancel();
                return;
            }
        };
        for second in [false, true] {
            let name = tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            if second {
                tracing::warn!("{name} again: stopping at once");
                now.cancel();
            } else {
                tracing::info!("{name}: shutting down: {what}; a second SIGINT or SIGTERM stops at once");
                graceful.cancel();
            }
        }
    });
}
