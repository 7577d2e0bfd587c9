//! Tasks over a partitioned queue (ARCHITECTURE.md, "Partitioned queues"): dispatch as a home
//! record and one share per partition, the report of each ended share to the home (repeated
//! until acknowledged), and the removal of shares whose home record is gone.

use redis::aio::ConnectionLike;
use shardctl_common::model::TaskSpec;
use shardctl_common::partition::Layout;
use shardctl_common::scripts::{self, Reported, ShareReport};
use shardctl_common::{Error, Home, Keys, Result, ScriptCode};

/// On a partitioned queue, creates `spec` over its partitions and returns their layout; `None`
/// on a queue of one partition (nothing done). A change of the layout between its reading and
/// the task's creation (refused: `LayoutChanged`, ARCHITECTURE.md "Changing the layout") is
/// read again, three times at most.
pub(crate) async fn create_over<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Home,
    spec: &TaskSpec,
    shard_keys: Option<&[String]>,
) -> Result<Option<Layout>> {
    for _ in 0..3 {
        let layout = shardctl_common::partition::layout(con, keys).await?;
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
    for pk in &layout.parts {
        let mut router = crate::route::Router::new(live.clone());
        router.serving(served.clone());
        placed += router.route_task(con, pk, id).await?;
    }
    Ok((placed, live.len()))
}

/// Shares read from a partition's `unreported` per call.
const REPORT_BATCH: usize = 100;

/// The first [`REPORT_BATCH`] entries of `keys`' `unreported` (task → end ms): a partition's
/// ended shares to report, or the home's ended tasks whose shares to end.
async fn unreported_page<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Vec<(String, u64)>> {
    Ok(redis::cmd("ZRANGE")
        .arg(keys.unreported())
        .arg(0)
        .arg(REPORT_BATCH as i64 - 1)
        .arg("WITHSCORES")
        .query_async(con)
        .await?)
}

/// Reports every ended share found in the partitions' `unreported` to the home, then
/// acknowledges it there. Idempotent: whoever repeats it counts nothing twice. Returns how many
/// shares were counted now.
pub async fn report_pending<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<u64> {
    // (a partition unreachable now must not hold the reports of the others)
    if let Err(e) = end_pending(con, layout).await {
        tracing::warn!("ending the shares of ended tasks: {e}");
    }
    let mut counted = 0;
    for pk in &layout.parts {
        for (task, ended) in unreported_page(con, pk).await? {
            if report_share(con, &layout.home, pk, &task, ended).await? {
                counted += 1;
            }
        }
    }
    Ok(counted)
}

/// Ends the shares of every task found in the home's `unreported` (tasks over partitions whose
/// aggregation was recorded: `finish_task` lists them) as their home ended, dropping their
/// results unless the task keeps them (`end_share.lua`), then takes the entry out if it is
/// still the one read (`ack.lua`). A home gone, retried or of another layout only loses its
/// entry. Idempotent: whoever repeats it ends nothing twice.
async fn end_pending<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<()> {
    let home = &layout.home;
    for (task, ended) in unreported_page(con, home).await? {
        let tl = shardctl_common::partition::task_layout(con, home, &task).await?;
        let state: Option<String> = redis::cmd("HGET").arg(home.task(&task)).arg("state").query_async(con).await?;
        let inc = shardctl_common::share::home_inc_of(con, home, &task).await?;
        if let (Some(state @ ("completed" | "failed")), Some(inc)) = (state.as_deref(), inc) {
            for pk in &tl.parts {
                scripts::end_share(con, pk, &task, &inc, state).await?;
            }
        }
        scripts::ack(con, home, &task, ended).await?;
    }
    Ok(())
}

/// Reports one ended share; true when it was counted now.
async fn report_share<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    part: &Keys,
    task: &str,
    ended: u64,
) -> Result<bool> {
    type Fields = (Option<u32>, Option<u64>, Option<u64>, Option<u64>, Option<String>);
    let (p, round, done, failed, state): Fields = redis::cmd("HMGET")
        .arg(part.task(task))
        .arg(&["part", "round", "done", "failed", "state"])
        .query_async(con)
        .await?;
    let home_inc = shardctl_common::share::share_inc(con, part, task).await?;
    let counted = match (p, home_inc, round, done, failed, shardctl_common::share::ended(state.as_deref())) {
        (Some(part_no), Some(home_inc), Some(round), Some(done), Some(failed), true) => {
            let r = ShareReport { task: task.to_owned(), home_inc, part: part_no, round, done, failed };
            match scripts::report(con, home, &r).await? {
                Reported::Counted => true,
                // the home's master lost a retry its shares kept: the home is reopened to the
                // share's round for this partition, then counts it
                Reported::HomeBehind => {
                    let code = scripts::reopen(con, home, task, Some(round), &[part_no]).await?;
                    tracing::warn!(
                        task,
                        partition = part_no,
                        round,
                        code,
                        "the home had lost a retry: reopened to its share's round"
                    );
                    scripts::report(con, home, &r).await? == Reported::Counted
                }
                _ => false,
            }
        }
        // the share is gone (cleaned, expired) or runs again: nothing to count for this entry
        _ => false,
    };
    scripts::ack(con, part, task, ended).await?;
    if counted {
        tracing::debug!(task, partition = p.unwrap_or(0), "share counted in the home");
    }
    Ok(counted)
}

/// Creates share `p` of running task `id` again if it is missing and its dispatch is over: the
/// reconciliation takes the task's dispatch lease (`token`), which must have lapsed (its
/// dispatcher died or stalled) or be complete (the share's creation was lost with a
/// partition's master since). It is created in the home's round. A keyed share keeps the keys
/// its incarnation left complete; when they are not (a dispatch cut short while writing them,
/// or lost), the task cannot run as dispatched: it is cancelled, saying so. Returns whether
/// the lease was taken.
async fn recreate_share<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    p: u32,
    token: &str,
) -> Result<bool> {
    let t = crate::progress::task(con, &layout.home, id).await?;
    let (_, size) = shardctl_common::partition::share_range(p, t.partitions, t.total);
    if size == 0 || t.partitions != layout.count() {
        return Ok(false);
    }
    let lease = shardctl_common::incarnation::DISPATCH_LEASE;
    match scripts::dispatch_lease(con, &layout.home, id, &t.inc, scripts::LeaseAsk::Take, token, lease).await? {
        scripts::Lease::Granted => {}
        // its dispatcher is still creating it, or the task is gone
        _ => return Ok(false),
    }
    let pk = layout.part(p)?;
    if t.has_keys && !shardctl_common::partition::share_keys_complete(con, pk, id, &t.inc, size).await? {
        tracing::warn!(task = %id, partition = p, "a share's keys are lost (its dispatch was cut short, or a failover lost them): the task is cancelled; dispatch it again");
        if let Err(e) = shardctl_common::control::cancel(con, &layout.home, id).await {
            tracing::warn!(task = %id, "cancelling a task whose keys are lost: {e}");
        }
        return Ok(true);
    }
    let (priority, round): (Option<i64>, Option<u64>) =
        redis::cmd("HMGET").arg(layout.home.task(id)).arg("priority").arg("round").query_async(con).await?;
    tracing::warn!(task = %id, partition = p, "a share of a running task is missing: creating it again");
    let spec = shardctl_common::partition::spec_of(&t, priority.unwrap_or(0));
    shardctl_common::partition::create_share_keyed(
        con,
        &layout.home,
        pk,
        p,
        t.partitions,
        &spec,
        &t.inc,
        None,
        round.unwrap_or(0),
        Some(token),
    )
    .await?;
    Ok(true)
}

/// Tasks of the home's `running` looked at per [`reconcile`] call.
pub const RECONCILE_BATCH: isize = 100;

/// Repairs, for every running task over partitions, what a lost write would leave stuck (see
/// [`reconcile_page`]), in pages of [`RECONCILE_BATCH`] tasks. Returns how many shares were
/// counted now.
pub async fn reconcile<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<u64> {
    let (mut counted, mut from) = (0, 0);
    loop {
        let (n, next) = reconcile_page(con, layout, from).await?;
        counted += n;
        match next {
            Some(f) => from = f,
            None => return Ok(counted),
        }
    }
}

/// Repairs the running tasks over partitions at `from` in the home's `running`: an ended share
/// whose count the home lacks is reported again (a failover of the home's master can lose a
/// count its partition already acknowledged: replication is asynchronous); a retry cut short is
/// completed; a share missing once its dispatch is over (`dispatched`, or its dispatch lease
/// lapsed) is created again; an ended share a round ahead of its home reopens the home (in
/// its report); a cancelled share's home is cancelled. Idempotent like [`report_pending`]. Returns how many shares were counted
/// now, and where the next page starts (`None`: this was the last).
pub async fn reconcile_page<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    from: isize,
) -> Result<(u64, Option<isize>)> {
    let home = &layout.home;
    let ids: Vec<String> =
        redis::cmd("ZRANGE").arg(home.running()).arg(from).arg(from + RECONCILE_BATCH - 1).query_async(con).await?;
    let next = (ids.len() as isize == RECONCILE_BATCH).then_some(from + RECONCILE_BATCH);
    let mut counted = 0;
    let tags = shardctl_common::partition::tags_of(layout);
    for id in ids {
        let mut fields = ["partition_tags", "state", "round", "inc"].map(str::to_owned).to_vec();
        fields.extend((1..=layout.count()).map(|p| format!("part:{p}")));
        let row: Vec<Option<String>> = redis::cmd("HMGET").arg(home.task(&id)).arg(&fields).query_async(con).await?;
        // a task over other partitions than `layout`'s (this process has not yet seen a change
        // of the layout) is left to those that have
        if row[0].as_deref() != Some(tags.as_str()) || row[1].as_deref() != Some("running") {
            continue;
        }
        // a retry cut short after its home record was reopened: its shares run again now
        let round = row[2].as_deref().and_then(|r| r.parse().ok()).unwrap_or(0);
        let again = shardctl_common::retry::resume_retries(con, layout, &id, round).await?;
        if again > 0 {
            tracing::info!(task = %id, shards = again, "a retry cut short was completed");
        }
        let inc = shardctl_common::share::home_inc_of(con, home, &id).await?;
        // the dispatch lease, if this pass takes it to create missing shares
        let token = shardctl_common::incarnation::nonce();
        let mut took = false;
        for (i, pk) in layout.parts.iter().enumerate() {
            if row[4 + i].is_some() {
                continue;
            }
            let state: Option<String> = redis::cmd("HGET").arg(pk.task(&id)).arg("state").query_async(con).await?;
            // a share of another incarnation under this id (an earlier task's, or one a
            // failover of the home made a stranger) is not this task's: replaced like a missing one
            let ours = inc.is_some() && shardctl_common::share::share_inc(con, pk, &id).await? == inc;
            let state = if ours { state } else { None };
            match state.as_deref() {
                Some("aggregating" | "completed" | "failed") => {
                    if report_share(con, home, pk, &id, 0).await? {
                        tracing::info!(task = %id, partition = i + 1, "a share's count missing in the home was reported again");
                        counted += 1;
                    }
                }
                // a cancel whose home record was lost (a failover of the home's master)
                Some("cancelled") => {
                    if let Err(e) = shardctl_common::control::cancel(con, home, &id).await {
                        tracing::warn!(task = %id, "cancelling a task whose share was cancelled: {e}");
                    }
                }
                Some(_) => {}
                None => took |= recreate_share(con, layout, &id, i as u32 + 1, &token).await?,
            }
        }
        if took {
            // every share of the task exists now (this pass created those missing)
            let lease = shardctl_common::incarnation::DISPATCH_LEASE;
            if let Some(inc) = &inc {
                scripts::dispatch_lease(con, home, &id, inc, scripts::LeaseAsk::Done, &token, lease).await?;
            }
        }
    }
    Ok((counted, next))
}

/// How often every process serving the queue repeats the reports still pending.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// [`report_pending`] runs per [`reconcile`].
pub const RECONCILE_EVERY: u32 = 25;

/// How often [`upkeep`] checks, on a Redis Cluster, that the partitions lie over as many masters
/// as a fresh choice would put them on
/// ([`replace_when_better`](shardctl_common::partition::replace_when_better)).
pub const PLACEMENT_CHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The upkeep of a queue's partitions that every executor node and coordinator runs beside its
/// home's stalled sweep, following the layout: each partition's sweep and the reports of ended
/// shares to the home ([`run`]), moved to the new partitions within
/// [`LAYOUT_CHECK`](shardctl_common::partition::LAYOUT_CHECK) of a change (ARCHITECTURE.md,
/// "Changing the layout"). Nothing runs while the queue has one partition. On a Redis Cluster it
/// also re-places the partitions when the slot map changed so that they would spread better,
/// checked at start and every [`PLACEMENT_CHECK`].
pub async fn upkeep(
    mut con: shardctl_common::conn::Conn,
    home: Home,
    sweep: crate::sweep::SweepConfig,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut current: Option<Layout> = None;
    let mut epoch = stop.child_token();
    let mut running: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let on_cluster = matches!(con, shardctl_common::conn::Conn::Cluster(_));
    let mut placed: Option<std::time::Instant> = None;
    loop {
        // the slot map may have changed (masters added, slots moved): re-place when it spreads
        if on_cluster && placed.is_none_or(|t| t.elapsed() >= PLACEMENT_CHECK) {
            placed = Some(std::time::Instant::now());
            match shardctl_common::partition::replace_when_better(&mut con, &home).await {
                Ok(Some(l)) => tracing::info!(
                    partitions = l.count(),
                    tags = %shardctl_common::partition::tags_of(&l),
                    "partitions re-placed over more of the cluster's masters"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!("checking where the queue's partitions lie: {e}"),
            }
        }
        match shardctl_common::partition::layout(&mut con, &home).await {
            Ok(layout) if current.as_ref() != Some(&layout) => {
                epoch.cancel();
                for t in running.drain(..) {
                    let _ = t.await;
                }
                epoch = stop.child_token();
                for pk in &layout.parts {
                    let (con, pk, sweep, epoch) = (con.clone(), pk.clone(), sweep.clone(), epoch.clone());
                    running.push(tokio::spawn(crate::sweep::run_partition(con, pk, sweep, epoch)));
                }
                if layout.partitioned() {
                    running.push(tokio::spawn(run(con.clone(), layout.clone(), epoch.clone())));
                }
                if current.is_some() {
                    tracing::info!(partitions = layout.count(), "the queue's partitions changed: upkeep follows");
                }
                current = Some(layout);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("reading the queue's partitions: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(shardctl_common::partition::LAYOUT_CHECK) => {}
            _ = stop.cancelled() => break,
        }
    }
    epoch.cancel();
    for t in running {
        let _ = t.await;
    }
}

/// Repeats [`report_pending`] every [`REPORT_EVERY`] until `stop`, and one page of
/// [`reconcile_page`] every [`RECONCILE_EVERY`] of them (5 s), the pages in turn.
pub async fn run(mut con: shardctl_common::conn::Conn, layout: Layout, stop: tokio_util::sync::CancellationToken) {
    let (mut round, mut from) = (0u32, 0isize);
    loop {
        if let Err(e) = report_pending(&mut con, &layout).await {
            tracing::warn!("reporting ended shares to the home: {e}");
        }
        round = round.wrapping_add(1);
        if round % RECONCILE_EVERY == 0 {
            match reconcile_page(&mut con, &layout, from).await {
                Ok((_, next)) => from = next.unwrap_or(0),
                Err(e) => tracing::warn!("checking the home's counts of ended shares: {e}"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REPORT_EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}
