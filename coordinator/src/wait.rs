//! Waiting for a task to end, with a progress callback. A waiting client reads the task's
//! counters a few times a second: that is a display, not a work loop, and costs one HGETALL.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Error, Keys, Result};

use crate::progress;

/// How often a waiter reads the task.
pub const POLL: Duration = Duration::from_millis(200);

/// Waits until the task is completed or failed, or `timeout` passes; calls `on_progress` with
/// every reading. Redis errors are retried until the timeout.
pub async fn wait<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    id: &str,
    timeout: Option<Duration>,
    mut on_progress: impl FnMut(&TaskInfo),
) -> Result<TaskInfo> {
    let start = Instant::now();
    loop {
        match progress::task(con, keys, id).await {
            Ok(t) => {
                on_progress(&t);
                if t.state.is_finished() {
                    return Ok(t);
                }
            }
            Err(e @ Error::NoTask(_)) => return Err(e),
            Err(e) if e.is_retryable() => tracing::warn!("reading task {id}: {e}"),
            Err(e) => return Err(e),
        }
        if let Some(t) = timeout {
            if start.elapsed() >= t {
                return Err(Error::Timeout(t));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
