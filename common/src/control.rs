//! Controls over tasks and queues once dispatched: cancel, retry, clean, and the queue-wide rate
//! limit the claim script enforces. Each is one script call (or one hash write).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::AsyncCommands;

use crate::error::{Error, Result, ScriptCode};
use crate::keys::Keys;
use crate::scripts::{scripts, KeyArgs};

fn refused(id: &str, code: i64, what: &str) -> Error {
    match ScriptCode::from_code(code) {
        Some(ScriptCode::TaskMissing) => Error::NoTask(id.to_owned()),
        Some(c) => Error::invalid(format!("cannot {what} task '{id}': {c}")),
        None => Error::Protocol(format!("unexpected reply {code} to {what}")),
    }
}

/// Cancels task `id`: nothing of it is claimed again, its running shards are stopped at their
/// executors' next heartbeat, and it ends `cancelled` without aggregation. Returns how many
/// running shards were stopped. A task that already ended is refused.
pub async fn cancel<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<u64> {
    crate::names::validate_task_id(id)?;
    let code: i64 = scripts()
        .cancel
        .keyed(keys, &KeyArgs { task: Some(id), ..Default::default() })
        .arg(keys.prefix())
        .arg(id)
        .invoke_async(con)
        .await?;
    if code < 0 {
        let e = refused(id, code, "cancel");
        return Err(match e {
            Error::Invalid(_) if code == -9 => Error::invalid(format!("task '{id}' already ended: nothing to cancel")),
            e => e,
        });
    }
    Ok(code as u64)
}

/// Runs the failed shards of task `id` again (or its failed aggregation); aggregation follows
/// once every shard is terminal. Returns how many shards go again (1 for an aggregation alone);
/// 0 when nothing had failed.
pub async fn retry<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<u64> {
    crate::names::validate_task_id(id)?;
    let code: i64 = scripts()
        .retry
        .keyed(keys, &KeyArgs { task: Some(id), ..Default::default() })
        .arg(keys.prefix())
        .arg(id)
        .invoke_async(con)
        .await?;
    match code {
        -9 => Err(Error::invalid(format!("task '{id}' was cancelled: dispatch it again instead"))),
        -10 => Err(Error::invalid(format!(
            "task '{id}' was dispatched with --keep-results false and has ended: the results of its completed \
             shards are gone, so its aggregation cannot run again; dispatch it again instead"
        ))),
        c if c < 0 => Err(refused(id, c, "retry")),
        c => Ok(c as u64),
    }
}

/// Removes ended tasks whose retention ran out and, with `older_than`, every task that ended at
/// least that long ago (by the Redis server's clock); all their keys go. Returns how many tasks
/// were removed.
pub async fn clean<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, older_than: Option<Duration>) -> Result<u64> {
    let older = older_than.map_or(-1, |d| d.as_millis() as i64);
    let mut removed = 0;
    loop {
        let (listed, n): (u64, u64) = scripts()
            .clean
            .keyed(keys, &KeyArgs::default())
            .arg(keys.prefix())
            .arg(older)
            .arg(CLEAN_BATCH)
            .invoke_async(con)
            .await?;
        removed += n;
        // entries read, stale ones included: a short batch means none is left
        if listed < CLEAN_BATCH {
            return Ok(removed);
        }
    }
}

/// Tasks removed per `clean` script call (keeps each call short).
const CLEAN_BATCH: u64 = 200;

/// The queue-wide rate limit: at most `max` shards start in any window of `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Shards per window.
    pub max: u64,
    /// The window.
    pub per: Duration,
}

/// Sets (or with `None` removes) the queue's rate limit; claims obey it from their next call.
pub async fn set_limit<C: ConnectionLike + Send + Sync>(
    con: &mut C,
    keys: &Keys,
    limit: Option<RateLimit>,
) -> Result<()> {
    match limit {
        Some(l) => {
            if l.max == 0 || l.per < Duration::from_millis(1) {
                return Err(Error::invalid("a rate limit needs --max at least 1 and --per at least 1ms"));
            }
            let () = con
                .hset_multiple(keys.meta(), &[("limit_max", l.max), ("limit_per_ms", l.per.as_millis() as u64)])
                .await?;
        }
        None => {
            let () = con.hdel(keys.meta(), &["limit_max", "limit_per_ms", "limit_used"]).await?;
            let () = con.del(keys.limiter()).await?;
        }
    }
    // executors waiting out a full window wake and claim under the new limit
    let () = con.zadd(keys.marker(), "0", 0).await?;
    Ok(())
}

/// The queue's rate limit, if any.
pub async fn limit<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Option<RateLimit>> {
    let (max, per): (Option<u64>, Option<u64>) =
        redis::cmd("HMGET").arg(keys.meta()).arg("limit_max").arg("limit_per_ms").query_async(con).await?;
    Ok(max.zip(per).map(|(max, per)| RateLimit { max, per: Duration::from_millis(per) }))
}
