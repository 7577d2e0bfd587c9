//! The confirmations of what a waiter promises (`docs/design/durability.md`): a task's end reached
//! what the queue's durability asks before `wait` returns it; and the durability `status`
//! shows. Mode `none` sends nothing.

use redis::aio::ConnectionLike;
use shardctl_common::durability;
use shardctl_common::{Home, Result};

/// Whether task `id`'s end (`state`, seen by a read just before) is durable: a confirmation of its
/// home reads the same state. `false` while the wait times out, or when the end was lost (the
/// caller waits on).
pub async fn ended<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str, state: &str) -> Result<bool> {
    let d = match durability::read(con, home).await {
        Ok(d) => d,
        Err(e) if e.is_retryable() => return Ok(false),
        Err(e) => return Err(e),
    };
    if !d.waits() {
        return Ok(true);
    }
    let mut reads = redis::pipe();
    reads.cmd("HGET").arg(home.task(id)).arg("state");
    let s = match durability::confirm(con, home.keys(), &d, &reads).await {
        Ok(s) => s,
        // (the waiter reads again: a failover under way)
        Err(e) if e.is_retryable() => return Ok(false),
        Err(e) => return Err(e),
    };
    let now: Option<String> = s.read(0)?;
    Ok(s.durable && now.as_deref() == Some(state))
}

/// A queue's durability as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// The mode's name.
    pub mode: &'static str,
    /// One wait's timeout, ms.
    pub timeout_ms: u64,
    /// A confirmation of the home succeeded just now; `None` in mode `none`.
    pub in_sync: Option<bool>,
    /// How long the confirmations of some slot of the queue have timed out, none succeeding since.
    pub unsynced_for_ms: Option<u64>,
}

/// The queue's durability, and whether it is kept: every slot's mark of confirmations timing out,
/// and a confirmation of the home made now (so that replicas gone from an idle queue are seen).
pub async fn status<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Status> {
    let d = durability::read(con, home).await?;
    let mut st = Status {
        mode: d.mode.as_str(),
        timeout_ms: d.timeout.as_millis() as u64,
        in_sync: None,
        unsynced_for_ms: None,
    };
    if !d.waits() {
        return Ok(st);
    }
    // first the probe: one that succeeds deletes the home's mark
    let probe = durability::confirm(con, home.keys(), &d, &redis::pipe()).await?;
    st.in_sync = Some(probe.durable);
    let layout = shardctl_common::partition::layout(con, home).await?;
    let now = shardctl_common::time::server_now_ms(con, home.keys()).await?;
    for keys in layout.partitions.iter().chain([home.keys()]) {
        if let Some(since) = durability::unsynced_since(con, keys).await? {
            let age = now.saturating_sub(since);
            st.unsynced_for_ms = Some(st.unsynced_for_ms.map_or(age, |a| a.max(age)));
        }
    }
    Ok(st)
}
