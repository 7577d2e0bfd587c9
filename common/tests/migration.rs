//! A script that aborts part-way keeps its earlier writes (Redis rolls nothing back). On a
//! cluster, a key a script derives (not declared) that is missing while its slot migrates aborts
//! the script at the command that touches it. The scripts read every such key before their first
//! write (docs/design/declared-keys.md, order of writes), so an abort leaves nothing written:
//! each case here failed before (review of issue 11: a shard counted with its result lost and no
//! aggregation ever enqueued; a delayed task that never started), against a real 3-master
//! cluster whose slot is set MIGRATING by hand, the script called on the source node.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimRequest, Finished, FinishedAs};
use shardctl_common::Home;
use shardctl_testkit::TestCluster;

/// The slot's owner and another master, with `slot` set MIGRATING from the one to the other.
fn start_migrating(cluster: &TestCluster, slot: u16) -> (u16, u16) {
    let owner = cluster.owner(slot);
    let to = *cluster.ports().iter().find(|&&p| p != owner).expect("another master");
    (cluster.begin_migration(slot, to), to)
}

async fn node(port: u16) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Makes every queue-level key exist, as on a busy queue: the declared keys then pass Redis's own
/// check on the source node and the script runs there.
async fn busy(con: &mut MultiplexedConnection, home: &Home) {
    let p = home.prefix();
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg(format!("{p}stalled"))
        .arg("zz")
        .cmd("ZADD")
        .arg(format!("{p}unreported"))
        .arg(9e15)
        .arg("zz")
        .cmd("ZADD")
        .arg(format!("{p}expiring"))
        .arg(9e15)
        .arg("zz")
        .cmd("ZADD")
        .arg(format!("{p}finished"))
        .arg(1)
        .arg("zz")
        .cmd("RPUSH")
        .arg(format!("{p}wait"))
        .arg("zz:1:0")
        .cmd("ZADD")
        .arg(format!("{p}marker"))
        .arg(0)
        .arg("0")
        .cmd("ZADD")
        .arg(format!("{p}unrouted"))
        .arg(1)
        .arg("zz")
        .cmd("ZADD")
        .arg(format!("{p}tasks"))
        .arg(1)
        .arg("zz")
        .cmd("SADD")
        .arg(format!("{p}routed-nodes"))
        .arg("zz")
        .cmd("ZADD")
        .arg(format!("{p}delayed"))
        .arg(9e15)
        .arg("zz:1:0")
        .cmd("ZADD")
        .arg(format!("{p}running"))
        .arg(1)
        .arg("zz")
        .cmd("HSET")
        .arg(format!("{p}meta"))
        .arg("x")
        .arg(1)
        .cmd("XADD")
        .arg(format!("{p}events"))
        .arg("*")
        .arg("e")
        .arg(1)
        .query_async(con)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_completion_aborted_by_a_migrating_slot_writes_nothing() {
    let cluster = TestCluster::start(3);
    let keys = Home::new("shardctl", "mig-complete").unwrap();
    let slot = cluster.keyslot(&keys.meta());
    let mut con = node(cluster.owner(slot)).await;
    let mut spec = TaskSpec::new("x", "noop", 2);
    spec.retain = None;
    scripts::dispatch(&mut con, &keys, &spec).await.unwrap();
    let req = ClaimRequest {
        count: 2,
        lock_ms: 60_000,
        instance: "e1",
        seq: 1,
        node: "n1",
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let c = scripts::claim(&mut con, &keys, &req).await.unwrap().shards;
    assert_eq!(c.len(), 2);
    // shard 0 completes with no result: `:terminal` exists, `:results` does not
    let done0 = [Finished { claim: &c[0], outcome: FinishedAs::Completed(""), ran_ms: None }];
    assert_eq!(scripts::finish(&mut con, &keys, "n1", &done0).await.unwrap(), [Ok(1)]);
    busy(&mut con, &keys).await;

    let (from, to) = start_migrating(&cluster, slot);
    let done1 = [Finished { claim: &c[1], outcome: FinishedAs::Completed(r#"{"v":2}"#), ran_ms: None }];
    let r = scripts::finish(&mut con, &keys, "n1", &done1).await;
    let e = r.expect_err("the script must abort at the missing `:results` of a migrating slot");
    // a missing key: "non local key"; a multi-key read of some moved keys: TRYAGAIN
    assert!(
        e.is_script_error() || e.to_string().contains("non local key") || e.to_string().contains("TryAgain"),
        "{e}"
    );
    // nothing was written: not counted, not terminal, still held by its claim
    let t: (Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(keys.task("x")).arg("done").arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(t, (Some("1".into()), Some("running".into())), "the aborted completion counted something");
    let bit: u8 = redis::cmd("GETBIT").arg(keys.terminal("x")).arg(1).query_async(&mut con).await.unwrap();
    assert_eq!(bit, 0);
    let held: Option<String> =
        redis::cmd("HGET").arg(keys.active()).arg(c[1].shard_ref.to_string()).query_async(&mut con).await.unwrap();
    assert_eq!(held.as_deref(), Some(c[1].token.as_str()));

    // the migration called off, the holder's retry counts it once and the aggregation follows
    cluster.abort_migration(slot, from, to);
    assert_eq!(scripts::finish(&mut con, &keys, "n1", &done1).await.unwrap(), [Ok(1)]);
    let t: (Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(keys.task("x")).arg("done").arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(t, (Some("2".into()), Some("aggregating".into())));
    let wait: Vec<String> =
        redis::cmd("LRANGE").arg(keys.lane_wait("noop")).arg(0).arg(-1).query_async(&mut con).await.unwrap();
    assert_eq!(wait.iter().filter(|r| r.ends_with(":agg")).count(), 1, "{wait:?}");
}

#[tokio::test]
async fn a_promotion_aborted_by_a_migrating_slot_leaves_the_delayed_task_scheduled() {
    let cluster = TestCluster::start(3);
    let keys = Home::new("shardctl", "mig-promote").unwrap();
    let slot = cluster.keyslot(&keys.meta());
    let mut con = node(cluster.owner(slot)).await;
    let mut spec = TaskSpec::new("d", "noop", 1);
    spec.delay = Some(Duration::from_millis(50));
    scripts::dispatch(&mut con, &keys, &spec).await.unwrap();
    busy(&mut con, &keys).await;
    let (from, to) = start_migrating(&cluster, slot);
    // the task's hash moves first; its entry in `scheduled` is still on the source
    cluster.move_keys(from, to, &[keys.task("d")]);
    tokio::time::sleep(Duration::from_millis(80)).await;
    let r = scripts::promote(&mut con, &keys).await;
    assert!(r.is_err(), "the script must abort at the moved task hash: {r:?}");
    let at: Option<f64> = redis::cmd("ZSCORE").arg(keys.scheduled()).arg("d").query_async(&mut con).await.unwrap();
    assert!(at.is_some(), "the aborted promotion took the task out of `scheduled`");
    // the migration finishes; the next promotion, on the new owner, starts the task
    cluster.migrate_slot(slot, to);
    let mut con = node(to).await;
    scripts::promote(&mut con, &keys).await.unwrap();
    let state: Option<String> =
        redis::cmd("HGET").arg(keys.task("d")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state.as_deref(), Some("running"));
    let runnable: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.lane_tasks("noop")).arg(0).arg(-1).query_async(&mut con).await.unwrap();
    assert!(runnable.contains(&"d".to_owned()), "{runnable:?}");
}

/// A dispatch while its slot migrates writes nothing: its declared keys (the new task's record
/// is missing on the source) refuse it before it runs, and its lane, derived, is read before
/// its first write too (`create_task`), for a caller that reached the script.
#[tokio::test]
async fn a_dispatch_during_a_migration_writes_nothing() {
    let cluster = TestCluster::start(3);
    let keys = Home::new("shardctl", "mig-lane").unwrap();
    let slot = cluster.keyslot(&keys.meta());
    let mut con = node(cluster.owner(slot)).await;
    // a task of the kind before: its lane's keys exist
    let mut first = TaskSpec::new("a", "noop", 2);
    first.retain = None;
    scripts::dispatch(&mut con, &keys, &first).await.unwrap();
    busy(&mut con, &keys).await;
    let (from, to) = start_migrating(&cluster, slot);
    // the lane's `tasks` moves first: a dispatch of that kind would write it last
    cluster.move_keys(from, to, &[keys.lane_tasks("noop")]);
    let mut spec = TaskSpec::new("b", "noop", 2);
    spec.retain = None;
    let r = scripts::dispatch(&mut con, &keys, &spec).await;
    assert!(r.is_err(), "the dispatch must be refused before its first write: {r:?}");
    // the migration finishes: nothing of the aborted dispatch moved with the slot
    cluster.migrate_slot(slot, to);
    let mut con = node(to).await;
    let n: u64 = redis::cmd("EXISTS").arg(keys.task("b")).query_async(&mut con).await.unwrap();
    assert_eq!(n, 0, "the aborted dispatch left a task record that no claim would read");
    let indexed: Option<f64> = redis::cmd("ZSCORE").arg(keys.index()).arg("b").query_async(&mut con).await.unwrap();
    assert!(indexed.is_none());
    // the dispatch again, on the new owner: the task is runnable
    scripts::dispatch(&mut con, &keys, &spec).await.unwrap();
    let runnable: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.lane_tasks("noop")).arg(0).arg(-1).query_async(&mut con).await.unwrap();
    assert_eq!(runnable, ["a", "b"]);
}
