//! The reconciliation: what a lost write between two slots leaves stuck, repaired.

use redis::aio::ConnectionLike;
use shardctl_common::partition::Layout;
use shardctl_common::scripts;
use shardctl_common::Result;

use super::report::{recreate_share, report_share};

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
/// its report); a cancelled share's home is cancelled. Idempotent like [`report_pending`](super::report_pending). Returns how many shares were counted
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
        for (i, pk) in layout.partitions.iter().enumerate() {
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
                    if report_share(con, home, pk, &id, 0).await?.counted {
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
