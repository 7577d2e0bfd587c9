//! Maintenance: the stalled sweep, due retries, departed nodes, give-backs after a lost reply,
//! and reading a lease.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::keys::Keys;

use super::registry::*;

/// How long executor `instance`'s lease has left by the server's clock; `None` when it has none or
/// it expired (its shards are the sweep's).
pub async fn lease_left_ms<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, instance: &str) -> Result<Option<u64>> {
    let expiry: Option<u64> = redis::cmd("ZSCORE").arg(keys.leases()).arg(instance).query_async(con).await?;
    let Some(expiry) = expiry else { return Ok(None) };
    let now = crate::time::server_now_ms(con, keys).await?;
    Ok(expiry.checked_sub(now).filter(|&l| l > 0))
}

/// What one stalled sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Stalled shards put back in `wait`.
    pub recovered: u64,
    /// Stalled shards failed for good (over the cap).
    pub failed: u64,
    /// Active shards whose holder has no lease entry at all, marked for the next full sweep to
    /// confirm.
    pub marked: u64,
}

/// One call of the sweep: what it did, and when to call again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// `None` when nothing ran: no lease had expired and the full sweep ran within its interval.
    pub report: Option<SweepReport>,
    /// How long from now (the server's clock) the earliest live lease expires; `None` when no
    /// executor holds one. The sweep loop calls again then, so that a dead executor's shards
    /// come back as soon as its lease runs out.
    pub next_expiry_in_ms: Option<u64>,
}

/// The reason a shard fails with once it stalled more than allowed.
pub const STALLED_REASON: &str = "shard stalled more than allowable limit";

/// Recovers the shards of every executor whose lease expired, and runs the full sweep (which
/// also finds shards whose holder has no lease at all) unless another ran within `interval_ms`.
pub async fn sweep<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    interval_ms: u64,
    max_stalled: u32,
) -> Result<Sweep> {
    let v: Vec<i64> = scripts()
        .sweep
        .keyed(keys, &KeyArgs::default())
        .arg(keys.prefix())
        .arg(interval_ms.max(1))
        .arg(max_stalled)
        .arg(STALLED_REASON)
        .invoke_async(con)
        .await?;
    let [ran, r, f, m, next] = v.as_slice() else {
        return Err(Error::Protocol(format!("sweep reply {v:?}")));
    };
    Ok(Sweep {
        report: (*ran == 1).then_some(SweepReport { recovered: *r as u64, failed: *f as u64, marked: *m as u64 }),
        next_expiry_in_ms: (*next >= 0).then_some(*next as u64),
    })
}

/// Moves what a version before lanes queued (`wait`, `tasks`) into the lanes of its kinds
/// (`move_legacy.lua`); returns how many refs and tasks moved. Every sweep loop calls it.
pub async fn move_legacy<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<u64> {
    let n: i64 = scripts().move_legacy.keyed(keys, &KeyArgs::default()).arg(keys.prefix()).invoke_async(con).await?;
    Ok(n.max(0) as u64)
}

/// Moves due retries from `delayed` to their lanes (a routed one's to its node's list); returns
/// how many.
pub async fn promote<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<u64> {
    let n: i64 = scripts().promote.keyed(keys, &KeyArgs::default()).arg(keys.prefix()).invoke_async(con).await?;
    Ok(n.max(0) as u64)
}

/// Nodes by liveness, judged by the Redis server's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Nodes whose membership ran out: removed, with their `node:<n>` hash, by this call.
    pub departed: Vec<String>,
    /// The live nodes, sorted.
    pub live: Vec<String>,
}

/// Removes departed nodes from the membership atomically and returns them with the live ones.
pub async fn reap<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Reaped> {
    let v: Vec<String> = scripts().reap.keyed(keys, &KeyArgs::default()).arg(keys.prefix()).invoke_async(con).await?;
    let split = v
        .iter()
        .position(String::is_empty)
        .ok_or_else(|| Error::Protocol("reap reply without its separator".into()))?;
    let mut live = v[split + 1..].to_vec();
    live.sort();
    Ok(Reaped { departed: v[..split].to_vec(), live })
}

/// Gives back `(ref, token)` shards held under an executor's tokens that it does not know (a claim
/// whose reply was lost), each only if that token still holds it; returns how many.
pub async fn disown<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, held: &[(String, String)]) -> Result<u64> {
    if held.is_empty() {
        return Ok(0);
    }
    let mut inv = scripts().disown.keyed(keys, &KeyArgs::default());
    inv.arg(keys.prefix());
    for (r, t) in held {
        inv.arg(r).arg(t);
    }
    let n: i64 = inv.invoke_async(con).await?;
    Ok(n.max(0) as u64)
}
