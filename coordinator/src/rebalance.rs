//! Failover and rebalancing, run by any live executor under a short lock so that one runs at a
//! time: departed nodes are dropped from the membership and their routed lists moved to the new
//! owners; recovered refs (`reroute`) are placed; unplaced tasks are placed; and when the
//! membership changed since the last placement, every live list is re-placed (refs whose owner
//! is unchanged stay on their node). Claims leave node lists alone while that runs.

use std::time::Duration;

use redis::AsyncCommands;
use shardctl_common::conn::Conn;
use shardctl_common::{scripts, Home, Keys, Result};

use crate::route::Router;

/// How long the rebalance lock (and the `rebalancing` flag) live if their holder dies; the
/// holder renews both after every chunk it moves, so a long rebalance keeps them.
pub const LOCK_TTL: Duration = Duration::from_secs(10);

/// What one rebalance did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebalanceReport {
    /// Nodes dropped from the membership (heartbeat too old).
    pub departed: Vec<String>,
    /// Live members after it.
    pub live: Vec<String>,
    /// Shards of unplaced tasks placed.
    pub placed: u64,
    /// Recovered or released refs placed.
    pub rerouted: u64,
    /// Refs moved off departed nodes' lists.
    pub failed_over: u64,
    /// Refs moved between live lists after a membership change.
    pub rebalanced: u64,
}

impl RebalanceReport {
    /// True when it moved or placed anything, or the membership changed.
    pub fn changed(&self) -> bool {
        !self.departed.is_empty() || self.placed + self.rerouted + self.failed_over + self.rebalanced > 0
    }

    /// Logs it as one line of fields (`rebalanced departed=… live=… placed=N …`).
    pub fn log(&self) {
        tracing::info!(
            departed = %self.departed.join(","),
            live = %self.live.join(","),
            placed = self.placed,
            rerouted = self.rerouted,
            failed_over = self.failed_over,
            rebalanced = self.rebalanced,
            "rebalanced"
        );
    }
}

/// Runs one rebalance unless another process holds the lock (`None`).
pub async fn rebalance(con: &mut Conn, home: &Home) -> Result<Option<RebalanceReport>> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let got: Option<String> = redis::cmd("SET")
        .arg(home.rebalance_lock())
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(LOCK_TTL.as_millis() as u64)
        .query_async(con)
        .await?;
    if got.is_none() {
        return Ok(None);
    }
    let r = run(con, home).await;
    let _ = con.del::<_, ()>(home.rebalancing()).await;
    scripts::unlock(con, &home.rebalance_lock(), &token).await?;
    r.map(Some)
}

/// Places what waits in keyspace `keys` (the queue's, or one partition's) over the live members
/// of `report`: unplaced tasks, reroutes, departed nodes' lists, and every live list when the
/// membership changed since the last placement there.
async fn place(con: &mut Conn, keys: &Keys, router: &mut Router, report: &mut RebalanceReport) -> Result<()> {
    let unrouted: Vec<String> = con.zrange(keys.unrouted(), 0, -1).await?;
    for id in unrouted {
        report.placed += router.route_task(con, keys, &id).await?;
    }
    report.rerouted += router.rehome_list(con, keys, &keys.reroute(), None).await?;

    let listed: Vec<String> = con.smembers(keys.routed_nodes()).await?;
    for n in listed.iter().filter(|n| !report.live.contains(n)) {
        report.failed_over += router.rehome_list(con, keys, &keys.node_wait(n), None).await?;
        scripts::forget(con, keys, n).await?;
    }

    let signature = router.signature();
    let placed: Option<String> = con.hget(keys.meta(), "placed_members").await?;
    if placed.as_deref() != Some(signature.as_str()) {
        let _: () = redis::cmd("SET")
            .arg(keys.rebalancing())
            .arg(1)
            .arg("PX")
            .arg(LOCK_TTL.as_millis() as u64)
            .query_async(con)
            .await?;
        for n in &report.live {
            let list = keys.node_wait(n);
            let len: u64 = con.llen(&list).await?;
            report.rebalanced += router.rehome_list(con, keys, &list, Some(len)).await?;
        }
        let _: () = con.hset(keys.meta(), "placed_members", &signature).await?;
    }
    Ok(())
}

async fn run(con: &mut Conn, home: &Home) -> Result<RebalanceReport> {
    let mut report = RebalanceReport::default();
    // each node's score is the time it is alive until (its heartbeat plus its own timeout), by
    // the server's clock; judged and removed in one script (a node that beats again after this
    // simply joins again)
    let reaped = scripts::reap(con, home).await?;
    report.departed = reaped.departed;
    report.live = reaped.live;
    if report.live.is_empty() {
        // nothing can be placed: unplaced tasks and reroutes wait for the first executor
        return Ok(report);
    }
    // what each member serves, read once for the home and every partition
    let served = crate::route::served(con, home, &report.live).await?;
    let mut router = Router::new(report.live.clone());
    router.serving(served.clone());
    router.keep_alive(vec![home.rebalance_lock(), home.rebalancing()], LOCK_TTL);
    place(con, home, &mut router, &mut report).await?;
    // a partitioned queue: the same in each partition, over the home's membership
    // (docs/design/partitions.md); each has its own lists, reroutes and flag
    let layout = shardctl_common::partition::layout(con, home).await?;
    for pk in &layout.partitions {
        let mut router = Router::new(report.live.clone());
        router.serving(served.clone());
        router.keep_alive(vec![pk.rebalancing()], LOCK_TTL);
        let r = place(con, pk, &mut router, &mut report).await;
        let _ = con.del::<_, ()>(pk.rebalancing()).await;
        r?;
    }
    Ok(report)
}
