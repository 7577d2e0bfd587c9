//! A task spread over partitions at dispatch: its shares created in each partition under the
//! dispatch lease, their key lists, and the spec each share is created from.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result, ScriptCode};
use crate::home::Home;
use crate::incarnation::DISPATCH_LEASE;
use crate::keys::Keys;
use crate::model::TaskSpec;
use crate::share::{home_inc_of, share_inc};

use super::layout::{share_range, Layout};

/// Creates the shares of home incarnation `inc` under its dispatch lease, held by `token`
/// (the creator's is the home record's nonce; a dispatch run again takes the lease first),
/// renewed before each share and each chunk of keys, then marks the dispatch complete
/// (docs/design/partitions.md). A lease lapsed or taken by
/// another stops it with an error: whoever took it creates what is missing.
pub async fn create_shares<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    spec: &TaskSpec,
    inc: &str,
    token: &str,
    keys: Option<&[String]>,
) -> Result<()> {
    let (home, k) = (&layout.home, layout.count());
    if !layout.partitioned() {
        return Ok(()); // the home record is its one share
    }
    for (i, pk) in layout.partitions.iter().enumerate() {
        renew(con, home, &spec.id, inc, token).await?;
        create_share_keyed(con, home, pk, i as u32 + 1, k, spec, inc, keys, 0, Some(token)).await?;
    }
    use crate::scripts::{Lease, LeaseAsk};
    match crate::scripts::dispatch_lease(con, home, &spec.id, inc, LeaseAsk::Done, token, DISPATCH_LEASE).await? {
        Lease::Granted => Ok(()),
        _ => Err(lease_lost(&spec.id)),
    }
}

/// Renews the dispatch lease of `id` (incarnation `inc`) for holder `token`; an error when it
/// lapsed, was taken by another, or the home is gone or another incarnation.
async fn renew<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str, inc: &str, token: &str) -> Result<()> {
    use crate::scripts::{Lease, LeaseAsk};
    match crate::scripts::dispatch_lease(con, home, id, inc, LeaseAsk::Renew, token, DISPATCH_LEASE).await? {
        Lease::Granted => Ok(()),
        _ => Err(lease_lost(id)),
    }
}

fn lease_lost(id: &str) -> Error {
    Error::invalid(format!(
        "the dispatch of task '{id}' lost its lease (it stalled past {}s, or the task was removed or dispatched again): \
         what is missing of it is created by the reconciliation",
        DISPATCH_LEASE.as_secs()
    ))
}

/// Creates share `p` of `k` of task `spec` in partition `pk`, for the incarnation `home_inc` of
/// its home record in `home`: nothing for an empty share, nothing when it exists already for
/// that incarnation; a share of another incarnation under this id (an earlier task's whose
/// removal was cut short, or one a failover of the home made a stranger) is removed, then this
/// one is created. A share created after its task was cancelled is cancelled at once.
pub async fn create_share<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    p: u32,
    k: u32,
    spec: &TaskSpec,
    home_inc: &str,
) -> Result<()> {
    create_share_keyed(con, home, pk, p, k, spec, home_inc, None, 0, None).await
}

/// Keys written per round trip when a share's keys are written.
const KEYS_CHUNK: usize = 5_000;

/// [`create_share`] of a task with one routing key per shard (`keys`, the task's): the share's
/// keys are written in its partition, at its own indexes, just before the share is created
/// (never over a share that exists: a resumed dispatch leaves its keys as they are). The id is
/// listed in the partition's `index` and the keys carry `home_inc` (field `inc`) before the
/// first key, so that a crash part-way leaves nothing `drop_orphans` cannot find; the home's
/// dispatch lease is renewed after every chunk.
#[allow(clippy::too_many_arguments)]
pub async fn create_share_keyed<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    p: u32,
    k: u32,
    spec: &TaskSpec,
    home_inc: &str,
    keys: Option<&[String]>,
    round: u64,
    lease: Option<&str>,
) -> Result<()> {
    let (base, size) = share_range(p, k, spec.shards);
    if size == 0 {
        // none here; another incarnation's share under this id goes
        if let Some(t) = share_inc(con, pk, &spec.id).await?.filter(|t| t != home_inc) {
            drop_stranger(con, home, pk, &spec.id, home_inc, &t).await?;
        }
        return Ok(());
    }
    let mut fields = spec.fields();
    // the task's limits are its home's to apply (docs/design/failure-policies.md, Over partitions)
    fields.retain(|f| f.0 != "max_failures" && f.0 != "success_when");
    for f in fields.iter_mut() {
        if f.0 == "total" {
            f.1 = size.to_string();
        }
        // a cap is split over the shares as the shards are, each at least 1
        // (docs/design/fairness.md): their sum is the task's cap unless it is below K
        if let ("max_running", Some(n)) = (f.0, spec.max_running) {
            f.1 = share_range(p, k, n).1.max(1).to_string();
        }
        // so is the cap of backups (docs/design/speculation.md)
        if let ("speculate", Some(m)) = (f.0, spec.speculate) {
            f.1 = share_range(p, k, m.at_least(spec.shards).max(1)).1.max(1).to_string();
        }
    }
    fields.extend([
        ("part", p.to_string()),
        ("base", base.to_string()),
        ("of", spec.shards.to_string()),
        ("home_inc", home_inc.to_owned()),
        // the home's round (a share created again by the reconciliation takes the one it has)
        ("round", round.to_string()),
    ]);
    let mut created = false;
    for _ in 0..3 {
        match share_inc(con, pk, &spec.id).await? {
            Some(t) if t == home_inc => return Ok(()), // ours: a dispatch resumed
            Some(t) => drop_stranger(con, home, pk, &spec.id, home_inc, &t).await?,
            None => {}
        }
        if let Some(keys) = keys {
            let share = &keys[base as usize..(base + size) as usize];
            write_share_keys(con, home, pk, &spec.id, home_inc, share, lease).await?
        } else if spec.has_keys && !share_keys_complete(con, pk, &spec.id, home_inc, size).await? {
            // created again without its keys (the reconciliation): it keeps those its
            // incarnation left complete, never another's or a part
            let () = redis::cmd("DEL").arg(pk.shard_keys(&spec.id)).query_async(con).await?;
        }
        match crate::scripts::dispatch_fields(con, pk, spec, &fields).await {
            Ok(()) => {
                created = true;
                break;
            }
            // created meanwhile (read again), or a record of this id with no `home_inc`
            Err(Error::Script(ScriptCode::TaskExists)) => {
                if share_inc(con, pk, &spec.id).await?.is_none() {
                    crate::scripts::drop_share(con, pk, &spec.id, "", "").await?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    if !created {
        return Err(Error::Protocol(format!("share {p} of task {} could not be created", spec.id)));
    }
    // a cancel of the task that came between its home record and this share misses the share:
    // it is cancelled here
    let state: Option<String> = redis::cmd("HGET").arg(home.task(&spec.id)).arg("state").query_async(con).await?;
    if home_inc_of(con, home, &spec.id).await?.as_deref() != Some(home_inc)
        || matches!(state.as_deref(), Some("cancelled") | None)
    {
        match crate::control::cancel_in(con, pk, &spec.id).await {
            Ok(_) | Err(Error::Refused { .. } | Error::NoTask(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the share of `id` in `pk` that names home incarnation `theirs`, for a creator of
/// incarnation `ours`, only while `ours` is still the home's: the share was read first, then
/// the home (a share of a newer incarnation exists only once its home does), so a creator that
/// stalled while its task was removed and dispatched again stops instead of removing the new
/// task's share (an error: nothing of `ours` is to be created any more).
async fn drop_stranger<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    id: &str,
    ours: &str,
    theirs: &str,
) -> Result<()> {
    if home_inc_of(con, home, id).await?.as_deref() != Some(ours) {
        return Err(Error::invalid(format!("task '{id}' was removed or dispatched again meanwhile")));
    }
    crate::scripts::drop_share(con, pk, id, theirs, "").await?;
    Ok(())
}

/// Writes `share`, the keys of one share of task `id` at its own indexes, for home incarnation
/// `home_inc`: the id listed in the partition's `index` and the keys' `inc` first (what
/// `drop_orphans` finds them by), the keys of an earlier incarnation dropped, then the keys in
/// chunks, renewing the home's dispatch lease after each (an error when the home is gone or
/// another incarnation: the dispatch was cancelled and cleaned, or lost, meanwhile).
async fn write_share_keys<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    pk: &Keys,
    id: &str,
    home_inc: &str,
    share: &[String],
    lease: Option<&str>,
) -> Result<()> {
    let kk = pk.shard_keys(id);
    let theirs: Option<String> = redis::cmd("HGET").arg(&kk).arg("inc").query_async(con).await?;
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("ZADD").arg(pk.index()).arg("NX").arg(0).arg(id).ignore();
    if theirs.as_deref() != Some(home_inc) {
        pipe.del(&kk).ignore();
    }
    pipe.hset(&kk, "inc", home_inc).ignore();
    let () = pipe.query_async(con).await?;
    for (c, chunk) in share.chunks(KEYS_CHUNK).enumerate() {
        // the lease first: a writer whose lease lapsed writes no more
        if let Some(token) = lease {
            renew(con, home, id, home_inc, token).await?;
        }
        let pairs: Vec<(usize, &String)> = chunk.iter().enumerate().map(|(j, key)| (c * KEYS_CHUNK + j, key)).collect();
        let () = redis::cmd("HSET").arg(&kk).arg(&pairs).query_async(con).await?;
    }
    Ok(())
}

/// Whether the keys of share `id` in `pk` are complete for home incarnation `home_inc`: its
/// `size` keys and its `inc` (a share lost with its keys kept, created again by the
/// reconciliation, keeps them).
pub async fn share_keys_complete<C: ConnectionLike + Send>(
    con: &mut C,
    pk: &Keys,
    id: &str,
    home_inc: &str,
    size: u64,
) -> Result<bool> {
    let kk = pk.shard_keys(id);
    let (inc, n): (Option<String>, u64) = redis::pipe().hget(&kk, "inc").hlen(&kk).query_async(con).await?;
    Ok(inc.as_deref() == Some(home_inc) && n == size + 1)
}

/// The spec a home record was dispatched with (what its shares are made of).
pub fn spec_of(t: &crate::model::TaskInfo, priority: i64) -> TaskSpec {
    let mut spec = TaskSpec::new(t.task_id.clone(), t.kind.clone(), t.total);
    spec.items = t.items;
    spec.payload = t.payload.clone();
    spec.attempts = t.attempts;
    spec.backoff = t.backoff.parse().unwrap_or_default();
    spec.priority = priority;
    spec.weight = t.weight;
    spec.group = t.group.clone();
    spec.max_running = t.max_running;
    spec.shard_timeout = (t.shard_timeout_ms > 0).then(|| std::time::Duration::from_millis(t.shard_timeout_ms));
    spec.keep_results = t.keep_results;
    spec.retain = (t.retain_ms > 0).then(|| std::time::Duration::from_millis(t.retain_ms));
    spec.strategy = t.strategy.parse().unwrap_or_default();
    spec.vnodes = t.vnodes;
    spec.speculate = t.speculate.map(crate::failure::Threshold::Count);
    spec.has_keys = t.has_keys;
    spec
}
