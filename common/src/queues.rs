//! Every queue of a prefix (docs/design/dashboard.md, "Every queue of the Redis"): the zset
//! `{P:queues}` of queue names, each scored by when a process last worked it (Redis's clock),
//! added to by every process that works a queue, read by the dashboard's queue switcher. No
//! queue's key is named so (each of theirs has a suffix after its tag, `{P:Q}:…`), and it is
//! within the keys the minimal ACL grants (`~{P:*`).

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::{names, Home};

/// At most this many queue names are listed: those worked last.
pub const MAX_LISTED: usize = 200;
/// A queue no process has worked for this long (ms) leaves the list.
pub const FORGET_AFTER_MS: u64 = 30 * 86_400_000;

/// The zset of the queue names of `prefix`.
pub fn key(prefix: &str) -> String {
    format!("{{{prefix}:queues}}")
}

/// Lists `home`'s queue among its prefix's, as worked now, and forgets the queues nobody worked
/// for [`FORGET_AFTER_MS`]. Best effort: a failure (the list's master down, an ACL scoped to
/// one queue) is logged, never the caller's: a dispatch or an executor goes on without it, and
/// the next call lists the queue again.
pub async fn register<C: ConnectionLike + Send>(con: &mut C, home: &Home) {
    let listed = async {
        let now = crate::time::server_now_ms(con, home).await?;
        let (prefix, queue) = home.names();
        let k = key(prefix);
        let () = redis::pipe()
            .zadd(&k, queue, now)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&k)
            .arg("-inf")
            .arg(format!("({}", now.saturating_sub(FORGET_AFTER_MS)))
            .ignore()
            .query_async(con)
            .await?;
        Ok::<_, crate::Error>(())
    };
    if let Err(e) = listed.await {
        tracing::warn!(queue = %home.queue(), "listing the queue among its prefix's (for the dashboard): {e}");
    }
}

/// The queue names of `prefix` worked last, at most [`MAX_LISTED`], sorted by name (a name
/// that is not a valid queue name is skipped, never made into a key); and whether more were
/// left out.
pub async fn list<C: ConnectionLike + Send>(con: &mut C, prefix: &str) -> Result<(Vec<String>, bool)> {
    let k = key(prefix);
    let (recent, all): (Vec<String>, usize) =
        redis::pipe().cmd("ZREVRANGE").arg(&k).arg(0).arg(MAX_LISTED - 1).zcard(&k).query_async(con).await?;
    let mut names: Vec<String> = recent.into_iter().filter(|n| names::validate_queue(n).is_ok()).collect();
    names.sort();
    Ok((names, all > MAX_LISTED))
}
