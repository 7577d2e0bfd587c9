//! Waiting for a task to end, with a progress callback. A waiting client reads the task's
//! counters a few times a second: that is a display, not a work loop, and costs one HGETALL.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_common::{Error, Home, Result};

use crate::progress;
use crate::stuck::Stuck;

/// How often a waiter reads the task.
pub const POLL: Duration = Duration::from_millis(200);

/// A task that showed no progress this long is looked at: why is it not moving?
pub const STUCK_AFTER: Duration = Duration::from_secs(2);
/// How often the reasons are read again while it stays stuck.
const STUCK_RECHECK: Duration = Duration::from_secs(1);

/// Waits until the task is completed or failed (and, when the queue's durability asks, that end
/// reached a replica), or `timeout` passes; calls `on_progress` with every reading. Redis
/// errors are retried until the timeout.
pub async fn wait<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    id: &str,
    timeout: Option<Duration>,
    on_progress: impl FnMut(&TaskInfo),
) -> Result<TaskInfo> {
    wait_explained(con, home, id, timeout, on_progress, |_| {}).await
}

/// [`wait`], and when the task has not moved for [`STUCK_AFTER`], `on_stuck` with the reasons
/// it may not be moving ([`crate::stuck::reasons`]) each time they change (empty: moving again,
/// or no reason known). A timeout says the last reasons known.
pub async fn wait_explained<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    id: &str,
    timeout: Option<Duration>,
    mut on_progress: impl FnMut(&TaskInfo),
    mut on_stuck: impl FnMut(&[Stuck]),
) -> Result<TaskInfo> {
    let start = Instant::now();
    let mut last: Option<((u64, u64, TaskState), Instant)> = None;
    let mut said: Vec<Stuck> = Vec::new();
    let mut checked: Option<Instant> = None;
    loop {
        match progress::task(con, home, id).await {
            Ok(t) => {
                on_progress(&t);
                // an end is returned once durable (the queue's durability; at once with none)
                if t.state.is_finished() && crate::confirm::ended(con, home, id, t.state.as_str()).await? {
                    // the end as read after its confirmation (its result is the one confirmed)
                    match progress::task(con, home, id).await {
                        Ok(after) if after.state == t.state => return Ok(after),
                        _ => {}
                    }
                }
                let now = (t.done, t.failed, t.state);
                let since = match last {
                    Some((seen, at)) if seen == now => at,
                    _ => Instant::now(),
                };
                last = Some((now, since));
                // the reasons cost a few reads: once a second while stuck, not every poll
                let why = if t.state.is_finished() {
                    // ended, not yet confirmed by a replica: said at once
                    vec![Stuck::Unconfirmed { state: t.state.as_str().to_owned() }]
                } else if since.elapsed() < STUCK_AFTER {
                    Vec::new()
                } else if checked.is_some_and(|c: Instant| c.elapsed() < STUCK_RECHECK) {
                    said.clone()
                } else {
                    checked = Some(Instant::now());
                    crate::stuck::reasons(con, home, &t).await.unwrap_or_default()
                };
                if why != said {
                    on_stuck(&why);
                    said = why;
                }
            }
            Err(e @ Error::NoTask(_)) => return Err(e),
            Err(e) if e.is_retryable() => tracing::warn!("reading task {id}: {e}"),
            Err(e) => return Err(e),
        }
        if let Some(t) = timeout {
            if start.elapsed() >= t {
                if said.is_empty() {
                    return Err(Error::Timeout(t));
                }
                let why: Vec<String> = said.iter().map(ToString::to_string).collect();
                return Err(Error::TimedOut { after: t, why: why.join("; ") });
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
