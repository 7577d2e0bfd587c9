//! Tasks over a partitioned queue (docs/design/partitions.md): dispatch as a home record and
//! one share per partition (here), the report of each ended share to the home, repeated until
//! acknowledged ([`report_pending`]), the home's decisions on failure limits and success goals
//! ([`decide_pass`]), the repair of what a lost write leaves stuck
//! ([`reconcile`]), and the upkeep every serving process runs ([`upkeep`]), a file each. The layout itself (which partitions a
//! queue has, where they lie) is `shardctl_common::partition`'s.

mod decide;
mod reconcile;
mod report;
mod upkeep;

pub use decide::{decide_pass, DECIDE_EVERY};
pub use reconcile::{reconcile, reconcile_page, RECONCILE_BATCH};
pub use report::report_pending;
pub use upkeep::{run, upkeep, PLACEMENT_CHECK, RECONCILE_EVERY, REPORT_EVERY};

use redis::aio::ConnectionLike;
use shardctl_common::model::TaskSpec;
use shardctl_common::partition::Layout;
use shardctl_common::scripts;
use shardctl_common::{Error, Home, Result, ScriptCode};

/// On a partitioned queue, creates `spec` over its partitions and returns their layout; `None`
/// on a queue of one partition (nothing done). A change of the layout between its reading and
/// the task's creation (refused: `LayoutChanged`, docs/design/partitions-repair.md) is
/// read again, three times at most.
pub(crate) async fn create_over<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    spec: &TaskSpec,
    shard_keys: Option<&[String]>,
) -> Result<Option<Layout>> {
    for _ in 0..3 {
        let layout = shardctl_common::partition::layout(con, home).await?;
        if !layout.partitioned() {
            return Ok(None);
        }
        let created = match shard_keys {
            Some(k) => dispatch_keyed(con, &layout, spec, k).await,
            None => dispatch(con, &layout, spec).await,
        };
        match created {
            Err(Error::Script(ScriptCode::LayoutChanged)) => continue,
            Err(e) => return Err(e),
            Ok(()) => return Ok(Some(layout)),
        }
    }
    Err(Error::Script(ScriptCode::LayoutChanged))
}

/// Creates task `spec` over the partitions of `layout`: its home record (the total, the counts
/// its shares report, the aggregation), then each non-empty share in its partition. Re-running
/// the same dispatch after a crash part-way creates the shares still missing. A routed share
/// waits unplaced in its partition until it is placed ([`route`], or any rebalance).
pub async fn dispatch<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, spec: &TaskSpec) -> Result<()> {
    if spec.has_keys {
        return Err(Error::invalid("a task with shard keys is dispatched with its keys (`dispatch_keyed`)"));
    }
    create(con, layout, spec, None).await
}

/// [`dispatch`] of a routed task with one routing key per shard (`--keys-file`): each share's
/// keys are written in its partition at the share's own indexes (`task:<id>:keys`, read by the
/// router that places the share and by the executor that runs a shard) just before the share
/// is created; a dispatch refused, or resumed over shares that exist, writes none.
pub async fn dispatch_keyed<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    spec: &TaskSpec,
    keys: &[String],
) -> Result<()> {
    if !spec.has_keys || keys.len() as u64 != spec.shards {
        return Err(Error::invalid(format!("{} keys given for {} shards", keys.len(), spec.shards)));
    }
    create(con, layout, spec, Some(keys)).await
}

async fn create<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    spec: &TaskSpec,
    keys: Option<&[String]>,
) -> Result<()> {
    spec.validate()?;
    let k = layout.count();
    let home = &layout.home;
    let mut fields = spec.fields();
    fields.push(("partitions", k.to_string()));
    fields.push(("partition_tags", shardctl_common::partition::tags_of(layout)));
    // the creator holds the dispatch lease under its record's nonce
    let mut token = fields.iter().find(|(f, _)| *f == "nonce").map(|(_, v)| v.clone()).unwrap_or_default();
    let resumed = match scripts::dispatch_fields(con, home, spec, &fields).await {
        Ok(()) => false,
        Err(Error::Script(ScriptCode::TaskExists)) => {
            // the same dispatch again, cut short before every share existed?
            let t = crate::progress::task(con, home, &spec.id).await?;
            if !spec.matches(&t) || t.partitions != k || t.state.is_finished() {
                return Err(Error::refused(
                    ScriptCode::TaskExists,
                    format!("a task with id '{}' already exists in this queue", spec.id),
                ));
            }
            true
        }
        Err(e) => return Err(e),
    };
    let inc = shardctl_common::share::home_inc_of(con, home, &spec.id)
        .await?
        .ok_or_else(|| Error::NoTask(spec.id.clone()))?;
    if resumed {
        // only once its first dispatcher's lease lapsed (or it completed: then only the shares
        // lost since are created)
        token = shardctl_common::incarnation::nonce();
        let lease = shardctl_common::incarnation::DISPATCH_LEASE;
        match scripts::dispatch_lease(con, home, &spec.id, &inc, scripts::LeaseAsk::Take, &token, lease).await? {
            scripts::Lease::Granted => {}
            scripts::Lease::Gone => return Err(Error::NoTask(spec.id.clone())),
            scripts::Lease::Refused => {
                return Err(Error::refused(
                    ScriptCode::TaskExists,
                    format!(
                        "task '{}' is being dispatched by another process (its dispatch lease lapses within {}s \
                         if that process died): dispatch it again then",
                        spec.id,
                        lease.as_secs()
                    ),
                ))
            }
        }
    }
    shardctl_common::partition::create_shares(con, layout, spec, &inc, &token, keys).await
}

/// Places the unplaced shards of routed task `id` in every partition of `layout` over the live
/// executors (the home's membership); returns how many this call placed and how many executors
/// live. With none, the shares wait unplaced for the first rebalance.
pub async fn route(con: &mut shardctl_common::conn::Conn, layout: &Layout, id: &str) -> Result<(u64, usize)> {
    let live = crate::membership::live(con, &layout.home).await?;
    if live.is_empty() {
        return Ok((0, 0));
    }
    let served = crate::route::served(con, &layout.home, &live).await?;
    let mut placed = 0;
    for pk in &layout.partitions {
        let mut router = crate::route::Router::new(live.clone());
        router.serving(served.clone());
        placed += router.route_task(con, pk, id).await?;
    }
    Ok((placed, live.len()))
}
