//! Every queue of a prefix (docs/design/dashboard.md, "Every queue of the Redis"): the set
//! `{P:queues}` of queue names, added to by every process that works a queue, read by the
//! dashboard's queue switcher. No queue's key is named so (each of theirs has a suffix after
//! its tag, `{P:Q}:…`), and it is within the keys the minimal ACL grants (`~{P:*`).

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::{names, Home};

/// At most this many queue names are listed.
pub const MAX_LISTED: usize = 200;

/// The set of the queue names of `prefix`.
pub fn key(prefix: &str) -> String {
    format!("{{{prefix}:queues}}")
}

/// Adds `home`'s queue to its prefix's set (idempotent: a name lost with a failover's writes
/// comes back at the next call).
pub async fn register<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    let (prefix, queue) = home.names();
    let _: u64 = redis::cmd("SADD").arg(key(prefix)).arg(queue).query_async(con).await?;
    Ok(())
}

/// The queue names of `prefix`, sorted, at most [`MAX_LISTED`] (a name that is not a valid queue
/// name is skipped, never made into a key); and whether more were left out. (`SMEMBERS`: the
/// minimal ACL has no `SSCAN`; a set of names of at most 64 bytes each.)
pub async fn list<C: ConnectionLike + Send>(con: &mut C, prefix: &str) -> Result<(Vec<String>, bool)> {
    let all: Vec<String> = redis::cmd("SMEMBERS").arg(key(prefix)).query_async(con).await?;
    let mut names: Vec<String> = all.into_iter().filter(|n| names::validate_queue(n).is_ok()).collect();
    names.sort();
    let more = names.len() > MAX_LISTED;
    names.truncate(MAX_LISTED);
    Ok((names, more))
}
