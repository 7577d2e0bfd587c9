//! Routing and membership: placing routed shards, moving lists, joining and leaving.

use redis::aio::ConnectionLike;
use redis::Value;

use crate::error::{Error, Result};
use crate::keys::Keys;

use super::decode::{code_result, int, string};
use super::registry::*;

/// Places shards `[from, from + owners.len())` of a routed task: `owners[i]` is the node of shard
/// `from + i`. Returns the new placement cursor; [`ScriptCode::RouteMoved`](crate::ScriptCode::RouteMoved) when `from` is stale.
pub async fn route<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    task: &str,
    from: u64,
    owners: &[&str],
) -> Result<u64> {
    let mut nodes: Vec<&str> = owners.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let mut inv = scripts().route.keyed(keys, &KeyArgs { task: Some(task), ..Default::default() });
    inv.arg(keys.prefix()).arg(task).arg(from).arg(nodes.len());
    for n in &nodes {
        inv.arg(*n);
    }
    for o in owners {
        inv.arg(nodes.binary_search(o).expect("owner listed") + 1);
    }
    let code: i64 = inv.invoke_async(con).await?;
    code_result(code).map(|c| c as u64)
}

/// Moves the refs `head` at the start of list `source` to their nodes (`dest[i]` for `head[i]`).
/// [`ScriptCode::HeadChanged`](crate::ScriptCode::HeadChanged) when the list no longer starts with them.
pub async fn rehome<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    source: &str,
    head: &[String],
    dest: &[&str],
) -> Result<u64> {
    assert_eq!(head.len(), dest.len(), "one destination per ref");
    let mut inv = scripts().rehome.keyed(keys, &KeyArgs { source: Some(source), ..Default::default() });
    inv.arg(keys.prefix()).arg(head.len());
    for r in head {
        inv.arg(r);
    }
    for d in dest {
        inv.arg(*d);
    }
    let code: i64 = inv.invoke_async(con).await?;
    code_result(code).map(|c| c as u64)
}

/// Who holds a node id, when [`join`] is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHolder {
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: String,
    /// Milliseconds since its last heartbeat.
    pub age_ms: u64,
    /// Its instance.
    pub instance: String,
    /// Its process identity, `<boot id>|<pid namespace>|<start time>` (empty when unknown).
    pub proc: String,
    /// Milliseconds until it counts as departed.
    pub left_ms: u64,
}

/// Joins the membership or refreshes this instance's heartbeat; `Err(holder)` when another
/// live instance holds the node id, unless it is `replace` (an instance the caller proved dead).
pub async fn join<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    node: &str,
    instance: &str,
    timeout_ms: u64,
    replace: Option<&str>,
    fields: &[(&str, String)],
) -> Result<std::result::Result<(), NodeHolder>> {
    let mut inv = scripts().join.keyed(keys, &KeyArgs { node: Some(node), ..Default::default() });
    inv.arg(node).arg(instance).arg(timeout_ms).arg(replace.unwrap_or(""));
    for (f, v) in fields {
        inv.arg(*f).arg(v);
    }
    let v: Vec<Value> = inv.invoke_async(con).await?;
    match v.as_slice() {
        [c] if int(c)? == 1 => Ok(Ok(())),
        [c, h, p, a, i, pr, l] if int(c)? == -5 => Ok(Err(NodeHolder {
            host: string(h)?,
            pid: string(p)?,
            age_ms: int(a)?.max(0) as u64,
            instance: string(i)?,
            proc: string(pr)?,
            left_ms: int(l)?.max(0) as u64,
        })),
        other => Err(Error::Protocol(format!("join reply {other:?}"))),
    }
}

/// Leaves the membership if this instance holds the node id; true when it did.
pub async fn leave<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, node: &str, instance: &str) -> Result<bool> {
    let r: i64 = scripts()
        .leave
        .keyed(keys, &KeyArgs { node: Some(node), ..Default::default() })
        .arg(node)
        .arg(instance)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

/// Forgets departed `node` if its routed list is empty; true when it did.
pub async fn forget<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, node: &str) -> Result<bool> {
    let r: i64 = scripts()
        .forget
        .keyed(keys, &KeyArgs { node: Some(node), ..Default::default() })
        .arg(node)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}
