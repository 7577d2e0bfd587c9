//! Coordinators announce themselves, so that `status` lists them and a schedule nobody will fire
//! is said to be so. Each `shardctl coordinator` keeps an entry in the zset `coordinators`:
//! `<host>-<pid>` → the time it counts as alive until (the server's clock: a refresh plus three
//! refresh periods, at least 5 s), renewed every refresh and removed when it stops.

use std::time::Duration;

use redis::aio::ConnectionLike;
use shardctl_common::time::server_now_ms;
use shardctl_common::{Home, Result};

/// A coordinator counts as alive this long after its last refresh, at least.
const MIN_ALIVE: Duration = Duration::from_secs(5);

/// This process's name among the coordinators.
pub fn me() -> String {
    shardctl_common::names::node_id_from_host(&shardctl_common::names::hostname(), std::process::id())
}

/// How long an entry announced with this `refresh` stays without a renewal: three refreshes, at
/// least 5 s.
pub fn lifetime(refresh: Duration) -> Duration {
    (refresh * 3).max(MIN_ALIVE)
}

/// Renews this coordinator's entry (alive for [`lifetime`]), drops the entries that ran out, and
/// lists the queue among its prefix's (`shardctl_common::queues`).
pub async fn announce<C: ConnectionLike + Send>(con: &mut C, home: &Home, refresh: Duration) -> Result<()> {
    let now = server_now_ms(con, home).await?;
    let alive = lifetime(refresh).as_millis() as u64;
    let () = redis::pipe()
        .zadd(home.coordinators(), me(), now + alive)
        .ignore()
        .cmd("ZREMRANGEBYSCORE")
        .arg(home.coordinators())
        .arg("-inf")
        .arg(now)
        .ignore()
        .query_async(con)
        .await?;
    // the queue is listed for every dashboard of its prefix (its own slot: another command)
    shardctl_common::queues::register(con, home).await;
    Ok(())
}

/// Removes this coordinator's entry (it stops).
pub async fn withdraw<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    let () = redis::cmd("ZREM").arg(home.coordinators()).arg(me()).query_async(con).await?;
    Ok(())
}

/// The live coordinators, each with how long it counts as alive still (ms), sorted.
pub async fn live<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Vec<(String, u64)>> {
    let now = server_now_ms(con, home).await?;
    let v: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
        .arg(home.coordinators())
        .arg(format!("({now}"))
        .arg("+inf")
        .arg("WITHSCORES")
        .query_async(con)
        .await?;
    let mut v: Vec<(String, u64)> = v.into_iter().map(|(c, until)| (c, until.saturating_sub(now))).collect();
    v.sort();
    Ok(v)
}
