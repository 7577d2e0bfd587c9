//! The upkeep of a queue's partitions beside its home's sweep, following the layout.

use shardctl_common::partition::Layout;
use shardctl_common::Home;

use super::decide::{decide_pass, DECIDE_EVERY};
use super::reconcile::reconcile_page;
use super::report::{report_all, Confirm};

/// How often every process serving the queue repeats the reports still pending.
pub const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// [`report_pending`](super::report_pending) runs per [`reconcile`](super::reconcile).
pub const RECONCILE_EVERY: u32 = 25;

/// How often [`upkeep`] checks, on a Redis Cluster, that the partitions lie over as many masters
/// as a fresh choice would put them on
/// ([`replace_when_better`](shardctl_common::partition::replace_when_better)).
pub const PLACEMENT_CHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The upkeep of a queue's partitions that every executor node and coordinator runs beside its
/// home's stalled sweep, following the layout: each partition's sweep and the reports of ended
/// shares to the home ([`run`]), moved to the new partitions within
/// [`LAYOUT_CHECK`](shardctl_common::partition::LAYOUT_CHECK) of a change
/// (docs/design/partitions-repair.md). Nothing runs while the queue has one partition. On a Redis
/// Cluster it
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
    let on_cluster = con.is_cluster();
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
                for pk in &layout.partitions {
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

/// Repeats [`report_pending`](super::report_pending) every [`REPORT_EVERY`] until `stop` (the
/// confirmations the queue's durability asks for made on a connection of their own), a [`decide_pass`] every
/// [`DECIDE_EVERY`] of them (1 s),
/// and one page of [`reconcile_page`] every [`RECONCILE_EVERY`] of them (5 s), the pages in turn.
pub async fn run(mut con: shardctl_common::conn::Conn, layout: Layout, stop: tokio_util::sync::CancellationToken) {
    let (mut round, mut from) = (0u32, 0isize);
    let (waiter, own) = (shardctl_common::durability::Waiter::new(layout.home.clone()), con.clone());
    loop {
        if let Err(e) = report_all(&mut con, &layout, &Confirm::Own(&waiter, &own)).await {
            tracing::warn!("reporting ended shares to the home: {e}");
        }
        round = round.wrapping_add(1);
        if round % DECIDE_EVERY == 0 {
            if let Err(e) = decide_pass(&mut con, &layout).await {
                tracing::warn!("deciding on the failure limits of tasks over partitions: {e}");
            }
        }
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
