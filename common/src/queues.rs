//! Every queue of a prefix (docs/design/dashboard.md, "Every queue of the Redis"): the set
//! `{P}:queues` of queue names, added to by every process that works a queue, read by the
//! dashboard's queue switcher. Its hash tag `{P}` is no queue's (theirs is `{P:Q}`), so the set
//! shares no slot and no key with any queue.

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::{names, Home};

/// At most this many queue names are listed.
pub const MAX_LISTED: usize = 200;

/// The set of the queue names of `prefix`.
pub fn key(prefix: &str) -> String {
    format!("{{{prefix}}}:queues")
}

/// Adds `home`'s queue to its prefix's set (idempotent: a name lost with a failover's writes
/// comes back at the next call).
pub async fn register<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    let (prefix, queue) = home.names();
    let _: u64 = redis::cmd("SADD").arg(key(prefix)).arg(queue).query_async(con).await?;
    Ok(())
}

/// The queue names of `prefix`, sorted, at most [`MAX_LISTED`] (a name that is not a valid queue
/// name is skipped, never made into a key); and whether more were left out.
pub async fn list<C: ConnectionLike + Send>(con: &mut C, prefix: &str) -> Result<(Vec<String>, bool)> {
    let k = key(prefix);
    let mut names = Vec::new();
    let mut cursor = 0u64;
    let mut more = false;
    loop {
        let (next, page): (u64, Vec<String>) =
            redis::cmd("SSCAN").arg(&k).arg(cursor).arg("COUNT").arg(100).query_async(con).await?;
        for n in page {
            if names::validate_queue(&n).is_err() || names.contains(&n) {
                continue;
            }
            if names.len() == MAX_LISTED {
                more = true;
                break;
            }
            names.push(n);
        }
        cursor = next;
        if cursor == 0 || more {
            break;
        }
    }
    names.sort();
    Ok((names, more))
}
