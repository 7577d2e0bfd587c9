//! The loop of `shardctl coordinator` that fires cron schedules: wakes at the next fire time of
//! any schedule (and at least every second, to see schedules added meanwhile) and handles the
//! due fire times.
//! Several coordinators race harmlessly: `fire.lua` creates each fire time's task once. Which
//! fire time is due is judged by the Redis server's clock (`TIME`), the one every coordinator
//! reads, so a coordinator whose own clock runs ahead fires nothing early.

use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::schedule::{self, Fired};
use shardctl_common::time::server_now_ms;
use shardctl_common::Home;
use tokio_util::sync::CancellationToken;

/// Longest sleep between two rounds.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Runs until `stop`.
pub async fn run(mut con: Conn, home: Home, stop: CancellationToken) {
    loop {
        let now = server_now_ms(&mut con, &home).await;
        let ticked = match now {
            Ok(now) => schedule::tick(&mut con, &home, now).await.map(|r| (now, r)),
            Err(e) => Err(e),
        };
        let sleep = match ticked {
            Ok((now, (done, next))) => {
                for (name, fire_ms, how) in done {
                    let id = schedule::task_id(&name, fire_ms);
                    match how {
                        Fired::Created => tracing::info!(schedule = %name, task = %id, "schedule fired"),
                        Fired::Missed => tracing::warn!(schedule = %name, task = %id, "fire time missed: skipped"),
                        Fired::Overlapping => {
                            tracing::info!(schedule = %name, task = %id, "previous run unfinished: skipped")
                        }
                        Fired::Refused => {
                            tracing::warn!(schedule = %name, task = %id, "task refused: spec out of limits")
                        }
                        Fired::AlreadyHandled | Fired::Exists | Fired::NotDueYet => {}
                    }
                }
                // both times are the server's; the wait itself is local
                next.map_or(MAX_SLEEP, |n| Duration::from_millis(n.saturating_sub(now)).min(MAX_SLEEP))
            }
            Err(e) => {
                tracing::warn!("schedules: {e}");
                MAX_SLEEP
            }
        };
        tokio::select! {
            // a few ms past the fire time: the clock has surely reached it
            _ = tokio::time::sleep(sleep + Duration::from_millis(2)) => {}
            _ = stop.cancelled() => return,
        }
    }
}
