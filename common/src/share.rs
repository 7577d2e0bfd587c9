//! The share-reading rule, once (ARCHITECTURE.md, "One task, one identity across slots"): a
//! record in a partition is task `id`'s share only if it names its home's incarnation id
//! (`home_inc` equal to the home's `inc`); anything else under the id (an earlier task's share,
//! or one a failover of the home made a stranger) is not read as the task's by any reader
//! (progress, reasons, the shard map, the aggregation, the reconciliation, retry).

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::keys::Keys;

/// The `inc` of a home record (its `seq` for one written before incarnations had a nonce),
/// `None` when it is gone.
pub async fn home_inc_of<C: ConnectionLike + Send>(con: &mut C, home: &Keys, id: &str) -> Result<Option<String>> {
    let (inc, seq): (Option<String>, Option<u64>) =
        redis::cmd("HMGET").arg(home.task(id)).arg("inc").arg("seq").query_async(con).await?;
    Ok(crate::incarnation::of_fields(inc.as_deref(), seq))
}

/// The `home_inc` of the share of `id` in `pk` (its `home_seq` for a share written before
/// incarnations had a nonce), `None` when there is no share.
pub async fn share_inc<C: ConnectionLike + Send>(con: &mut C, pk: &Keys, id: &str) -> Result<Option<String>> {
    let (inc, seq): (Option<String>, Option<u64>) =
        redis::cmd("HMGET").arg(pk.task(id)).arg("home_inc").arg("home_seq").query_async(con).await?;
    Ok(crate::incarnation::of_fields(inc.as_deref(), seq))
}

/// Fields `fields` of the share of `id` in `pk`, in one read, if it is the share of home
/// incarnation `inc`; `None` when there is none or it is another incarnation's.
pub async fn read<C: ConnectionLike + Send>(
    con: &mut C,
    pk: &Keys,
    id: &str,
    inc: &str,
    fields: &[&str],
) -> Result<Option<Vec<Option<String>>>> {
    let mut v: Vec<Option<String>> =
        redis::cmd("HMGET").arg(pk.task(id)).arg("home_inc").arg("home_seq").arg(fields).query_async(con).await?;
    let theirs = v[0].clone().or_else(|| v[1].clone());
    if theirs.as_deref() != Some(inc) {
        return Ok(None);
    }
    Ok(Some(v.split_off(2)))
}

/// A field of a share as read by [`read`], as a number (0 when absent or not a number).
pub fn num(v: &Option<String>) -> u64 {
    v.as_deref().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Whether a share in `state` has ended: every shard terminal, waiting for its home
/// (`aggregating`), or ended as its home did (`completed`, `failed`: `end_share.lua`).
pub fn ended(state: Option<&str>) -> bool {
    matches!(state, Some("aggregating" | "completed" | "failed"))
}
