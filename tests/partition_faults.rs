//! Regressions for the defects of tasks over partitions found by an independent review and a
//! chaos run (issue 23, D1–D7), each through the binary where it was seen through it, each
//! failing before its fix. The rules they check are ARCHITECTURE.md's "One task, one identity
//! across slots", "Who repairs what" and "Multi-slot operations".
//!
//! A lost write is staged as a failover to a lagging replica leaves it: the slot's keys put back
//! as they were before the write (DUMP before, RESTORE after), the other slots untouched.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::partition::{self, Layout};
use shardctl_common::scripts::{self, ClaimRequest, Finished, FinishedAs, Lease, LeaseAsk};
use shardctl_common::share::{self, Counted};
use shardctl_common::{Home, Keys};
use shardctl_testkit::{eventually, TestRedis};
use support::Cli;

/// Every key of hash tag `tag` (`{tag}:...`) with its DUMP and PTTL: what a replica that lags
/// from here on would hold.
fn snapshot(con: &mut redis::Connection, tag: &str) -> BTreeMap<String, (Vec<u8>, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{{{tag}}}:*")).query(con).unwrap();
    let mut out = BTreeMap::new();
    for k in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&k).query(con).unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(con).unwrap();
        if let Some(d) = dump {
            out.insert(k, (d, ttl.max(0)));
        }
    }
    out
}

/// Puts slot `tag` back to `snap`: the failover to the lagging replica.
fn roll_back(con: &mut redis::Connection, tag: &str, snap: &BTreeMap<String, (Vec<u8>, i64)>) {
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{{{tag}}}:*")).query(con).unwrap();
    for k in keys {
        let () = redis::cmd("DEL").arg(&k).query(con).unwrap();
    }
    for (k, (dump, ttl)) in snap {
        let () = redis::cmd("RESTORE").arg(k).arg(*ttl).arg(dump).arg("REPLACE").query(con).unwrap();
    }
}

/// A fresh directory for a test's files.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("shardctl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The partitions' hash tags, from `config --json`.
fn tags(cli: &Cli) -> Vec<String> {
    let v = cli.json(&["config", "--json"], 0);
    v["partition_tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect()
}

/// D1: a delayed consistent-hash task over 2 partitions runs each shard once and completes (its
/// home record, which holds no shard, was routed in the home when its delay was due: every
/// shard ran twice and the task failed).
#[test]
fn a_delayed_routed_task_over_partitions_runs_each_shard_once() {
    let cli = Cli::start("f-d1");
    cli.ok(&["config", "--partitions", "2"]);
    let dir = temp_dir("f-d1");
    let log = dir.join("runs");
    let exec = format!("sh -c 'echo $SHARDCTL_SHARD_INDEX >> {}; echo 1'", log.display());
    let _a = cli.executor("d1a", &["--exec", &exec]);
    let _b = cli.executor("d1b", &["--exec", &exec]);
    let args = ["dispatch", "--strategy", "consistent-hash", "--delay", "2s", "--shards", "10", "--task-id", "d"];
    cli.ok(&[&args[..], &["--kind", "report"]].concat());
    let t = cli.json(&["wait", "d", "--timeout", "60s", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(10), Some(0)),
        "{t}"
    );
    let mut runs: Vec<u64> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    runs.sort();
    assert_eq!(runs, (0..10).collect::<Vec<_>>(), "each shard runs once");
}

/// D3: the home's master loses a dispatch of `t3` whose shares survive on other masters; the
/// next dispatch of `t3` (the home hands out the same seq again) computes its own answer, not
/// the old task's: its shares are never taken for the old ones.
#[test]
fn a_dispatch_the_home_lost_is_never_taken_for_the_next_one() {
    let cli = Cli::start("f-d3");
    cli.ok(&["config", "--partitions", "2"]);
    let home = "shardctl:f-d3";
    let mut con = cli.con();
    let before = snapshot(&mut con, home);
    cli.ok(&["dispatch", "--task-id", "t3", "--kind", "primes", "--shards", "4", "--items", "1000"]);
    let _e = cli.executor("d3", &[]);
    let t = cli.json(&["wait", "t3", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["result"], json!({"primes": 168}), "{t}");
    drop(_e);
    // the home forgets the dispatch (its counter too); the shares keep theirs
    roll_back(&mut con, home, &before);
    let _e = cli.executor("d3b", &[]);
    let out = cli.ok(&[
        "dispatch",
        "--task-id",
        "t3",
        "--kind",
        "primes",
        "--shards",
        "4",
        "--items",
        "100000",
        "--wait",
        "--json",
    ]);
    let t: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(t["result"], json!({"primes": 9592}), "the new task's answer: {t}");
}

/// D2: the home's master loses a `retry` its shares kept (the shares a round ahead): the task
/// still ends, with the retried shards' outcomes; and on an ended task the lost retry is not
/// dropped either.
#[test]
fn a_retry_the_home_lost_still_runs_and_ends() {
    let cli = Cli::start("f-d2");
    cli.ok(&["config", "--partitions", "2"]);
    let home = "shardctl:f-d2";
    let flag = temp_dir("f-d2").join("ok");
    // fails until the flag file exists
    let exec = format!("sh -c 'test -e {} && echo 1'", flag.display());
    let e = cli.executor("d2", &["--exec", &exec]);
    cli.ok(&["dispatch", "--task-id", "r", "--kind", "x", "--shards", "6", "--attempts", "1"]);
    let t = cli.json(&["wait", "r", "--timeout", "60s", "--json"], 3);
    assert_eq!((t["state"].as_str(), t["failed"].as_u64()), (Some("failed"), Some(6)), "{t}");
    drop(e);
    let mut con = cli.con();
    let before = snapshot(&mut con, home);
    cli.ok(&["retry", "r"]);
    // the home's master fails over to a replica that never saw the retry
    roll_back(&mut con, home, &before);
    let st = cli.json(&["status", "r", "--json"], 0);
    assert_eq!(st["state"], json!("failed"), "the home lost the retry: {st}");
    std::fs::write(&flag, "").unwrap();
    let _e = cli.executor("d2b", &["--exec", &exec]);
    eventually("the retried task completes", Duration::from_secs(60), || {
        let st = cli.json(&["status", "r", "--json"], 0);
        if st["state"] == json!("completed") && st["done"] == json!(6) {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
}

/// D5 and D6: keys a dispatcher wrote for a share it never created are found by `clean`; and
/// `--keep-results false` leaves no per-shard result in any partition once the task ended.
#[test]
fn clean_finds_orphaned_keys_and_results_go_when_not_kept() {
    let cli = Cli::start("f-d5");
    cli.ok(&["config", "--partitions", "2"]);
    let dir = temp_dir("f-d5");
    let keys = dir.join("keys");
    std::fs::write(&keys, (0..6).map(|i| format!("k{i}\n")).collect::<String>()).unwrap();
    let k = keys.to_str().unwrap();
    cli.ok(&["dispatch", "--task-id", "kd", "--kind", "noop", "--strategy", "consistent-hash", "--keys-file", k]);
    let mut con = cli.con();
    // as if the dispatcher died after share 2's keys, before the share: only its keys remain
    let p2 = tags(&cli)[1].clone();
    for sfx in ["", ":terminal", ":results", ":errors", ":shards"] {
        let () = redis::cmd("DEL").arg(format!("{{{p2}}}:task:kd{sfx}")).query(&mut con).unwrap();
    }
    cli.ok(&["cancel", "kd"]);
    cli.ok(&["clean", "--older-than", "0s"]);
    let left: Vec<String> = redis::cmd("KEYS").arg("*task:kd*").query(&mut con).unwrap();
    assert!(left.is_empty(), "clean leaves {left:?}");

    // D6
    let _e = cli.executor("d6", &[]);
    let nr = ["dispatch", "--task-id", "nr", "--kind", "primes", "--shards", "8", "--items", "1000"];
    cli.ok(&[&nr[..], &["--keep-results", "false"]].concat());
    let t = cli.json(&["wait", "nr", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["result"], json!({"primes": 168}), "{t}");
    eventually("every share ended as its home, no per-shard result left", Duration::from_secs(30), || {
        let left: Vec<String> = redis::cmd("KEYS").arg("*task:nr:results").query(&mut con).unwrap();
        let states: Vec<Option<String>> = tags(&cli)
            .iter()
            .map(|tag| redis::cmd("HGET").arg(format!("{{{tag}}}:task:nr")).arg("state").query(&mut con).unwrap())
            .collect();
        if left.is_empty() && states.iter().all(|s| s.as_deref() == Some("completed")) {
            Ok(())
        } else {
            Err(format!("results {left:?}, shares {states:?}"))
        }
    });
    // with results kept (the default) they stay
    cli.ok(&["dispatch", "--task-id", "kr", "--kind", "primes", "--shards", "8", "--items", "1000", "--wait"]);
    let kept: Vec<String> = redis::cmd("KEYS").arg("*task:kr:results").query(&mut con).unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
}

/// D5, through a real dispatcher: SIGSTOPped while it writes a share's keys (before that share
/// exists), then SIGKILLed; `cancel` and `clean` leave no key of the task behind.
#[test]
fn clean_finds_the_keys_of_a_dispatcher_killed_while_writing_them() {
    let cli = Cli::start("f-d5k");
    cli.ok(&["config", "--partitions", "2"]);
    let dir = temp_dir("f-d5k");
    let keys = dir.join("keys");
    std::fs::write(&keys, (0..400_000).map(|i| format!("key-{i}\n")).collect::<String>()).unwrap();
    let k = keys.to_str().unwrap();
    let p2 = format!("{{{}}}:task:big", tags(&cli)[1]);
    let mut con = cli.con();
    let mut d = cli.background(
        "d5-dispatch",
        &["dispatch", "--task-id", "big", "--kind", "noop", "--strategy", "consistent-hash", "--keys-file", k],
    );
    // the moment share 2's keys are being written and share 2 is not created yet
    let caught = eventually("share 2's keys being written", Duration::from_secs(60), || {
        let (keys, share): (bool, bool) =
            redis::pipe().exists(format!("{p2}:keys")).exists(&p2).query(&mut con).unwrap();
        match (keys, share) {
            (true, false) => {
                d.signal("STOP");
                Ok(true)
            }
            (_, true) => Ok(false),
            _ => Err("not yet"),
        }
    });
    let (keys_now, share_now): (bool, bool) =
        redis::pipe().exists(format!("{p2}:keys")).exists(&p2).query(&mut con).unwrap();
    d.kill();
    assert!(caught && keys_now && !share_now, "the window was missed: keys {keys_now}, share {share_now}");
    cli.ok(&["cancel", "big"]);
    cli.ok(&["clean", "--older-than", "0s"]);
    let left: Vec<String> = redis::cmd("KEYS").arg("*task:big*").query(&mut con).unwrap();
    assert!(left.is_empty(), "clean leaves {left:?}");
}

/// D7: a duration or number out of range is refused up front, with a clear error, writing
/// nothing (a 300-million-year retention was accepted and failed the end's script part-way).
#[test]
fn out_of_range_durations_are_refused_up_front() {
    let cli = Cli::start("f-d7");
    for (flag, value) in
        [("--retain", "300000000y"), ("--delay", "300000000y"), ("--shard-timeout", "99999999999999999")]
    {
        cli.rejects(&["dispatch", "--kind", "noop", "--shards", "2", flag, value], 2, "too long");
    }
    cli.rejects(&["dispatch", "--kind", "noop", "--shards", "2", "--attempts", "20000"], 2, "attempts");
}

/// Claims every shard of partition `pk` and completes them, as an executor would.
async fn run_share(con: &mut redis::aio::MultiplexedConnection, pk: &Keys, seq: u64) {
    let req = ClaimRequest {
        count: 100,
        lock_ms: 60_000,
        instance: "e1",
        seq,
        node: "n1",
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let claimed = scripts::claim(con, pk, &req).await.unwrap().shards;
    let all: Vec<Finished<'_>> =
        claimed.iter().map(|c| Finished { claim: c, outcome: FinishedAs::Completed("1"), ran_ms: None }).collect();
    scripts::finish(con, pk, "n1", &all).await.unwrap();
}

async fn queue(redis: &TestRedis, name: &str) -> (redis::aio::MultiplexedConnection, Layout) {
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", name).unwrap();
    let layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    (con, layout)
}

/// Review: a share whose results were dropped at its task's end (`--keep-results false`) is
/// refused by an aggregation that meets it again (the home's end lost in a failover), rather
/// than read as a result of `null` for every shard.
#[tokio::test]
async fn an_aggregation_refuses_a_share_whose_results_were_dropped() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "dropped").await;
    let mut spec = TaskSpec::new("d", "noop", 4);
    spec.keep_results = false;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    for pk in &layout.partitions {
        run_share(&mut con, pk, 1).await;
    }
    shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap();
    let t = shardctl_coordinator::progress::task(&mut con, &layout.home, "d").await.unwrap();
    let shares = share::of(&mut con, &layout.home, &t).await.unwrap();
    assert_eq!(shares.len(), 2);
    for s in &shares {
        assert_eq!(share::check_counted(&mut con, &layout.home, &t, s).await.unwrap(), Counted::Sound);
    }
    // the home ended and its shares with it; then the home's end was lost (a failover)
    for s in &shares {
        assert!(scripts::end_share(&mut con, &s.keys, "d", &t.inc, "completed").await.unwrap());
    }
    for s in &shares {
        let got = share::check_counted(&mut con, &layout.home, &t, s).await.unwrap();
        assert!(matches!(got, Counted::Incomplete(ref why) if why.contains("dropped")), "{got:?}");
    }
}

/// Review: a share creator that stalled while its task was removed and dispatched again stops;
/// it never removes the new task's share (which it would take for a stranger).
#[tokio::test]
async fn a_stalled_share_creator_never_removes_a_newer_tasks_share() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "stalled").await;
    let spec = TaskSpec::new("x", "noop", 4);
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    let old = share::home_inc_of(&mut con, &layout.home, "x").await.unwrap().unwrap();
    shardctl_common::control::cancel(&mut con, &layout.home, "x").await.unwrap();
    shardctl_common::control::clean(&mut con, &layout.home, Some(Duration::ZERO)).await.unwrap();
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    let new = share::home_inc_of(&mut con, &layout.home, "x").await.unwrap().unwrap();
    assert_ne!(old, new);
    // the stalled creator of the old incarnation wakes
    let err = partition::create_share(&mut con, &layout.home, &layout.partitions[1], 2, 2, &spec, &old).await;
    assert!(err.is_err(), "a stale creator stops");
    assert_eq!(share::share_inc(&mut con, &layout.partitions[1], "x").await.unwrap(), Some(new));
}

/// Review: one dispatcher at a time holds a dispatch lease; a lapsed holder cannot renew it
/// (it stops writing), another takes it only once it lapsed, and a completed dispatch has none
/// to renew.
#[tokio::test]
async fn a_dispatch_lease_is_held_by_one_and_lost_when_it_lapses() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "lease").await;
    let home = layout.home.clone();
    let spec = TaskSpec::new("l", "noop", 4);
    let mut fields = spec.fields();
    let nonce = fields.iter().find(|(f, _)| *f == "nonce").unwrap().1.clone();
    fields.push(("partitions", "2".to_owned()));
    fields.push(("partition_tags", partition::tags_of(&layout)));
    scripts::dispatch_fields(&mut con, &home, &spec, &fields).await.unwrap();
    let inc = share::home_inc_of(&mut con, &home, "l").await.unwrap().unwrap();
    let creator = nonce.as_str();
    let c = &mut con;
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Renew, creator).await, Lease::Granted, "the creator holds it");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Take, "r").await, Lease::Refused, "live: not taken");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Renew, "r").await, Lease::Refused);
    // it lapses (its creator stalled)
    let () = redis::cmd("HSET").arg(home.task("l")).arg("dispatch_until").arg(1).query_async(c).await.unwrap();
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Renew, creator).await, Lease::Refused, "a lapsed holder writes no more");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Take, "r").await, Lease::Granted);
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Renew, creator).await, Lease::Refused, "taken");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Done, creator).await, Lease::Refused);
    // the stalled creator's dispatch stops at its next share
    let err = partition::create_shares(c, &layout, &spec, &inc, creator, None).await.unwrap_err();
    assert!(err.to_string().contains("lost its lease"), "{err}");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Done, "r").await, Lease::Granted);
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Renew, "r").await, Lease::Refused, "complete: no lease to renew");
    assert_eq!(ask(c, &home, &inc, LeaseAsk::Take, "z").await, Lease::Granted, "complete: lost shares may be made");
    assert_eq!(ask(c, &home, "1.other", LeaseAsk::Take, "z").await, Lease::Gone, "another incarnation");
}

async fn ask(con: &mut redis::aio::MultiplexedConnection, home: &Home, inc: &str, a: LeaseAsk, token: &str) -> Lease {
    scripts::dispatch_lease(con, home, "l", inc, a, token, Duration::from_secs(30)).await.unwrap()
}

/// Survey (a fix no test saw undone): a share the reconciliation recreates after its home was
/// retried runs in the home's round, not the first one.
#[tokio::test]
async fn a_share_recreated_after_a_retry_takes_its_homes_round() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "recreated-round").await;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("r", "noop", 4)).await.unwrap();
    let (home, pk) = (layout.home.clone(), layout.partitions[1].clone());
    // the home was retried into round 3 meanwhile, and the share's partition lost it whole
    let () = redis::cmd("HSET").arg(home.task("r")).arg("round").arg(3).query_async(&mut con).await.unwrap();
    let () = redis::cmd("HSET").arg(home.task("r")).arg("created_ms").arg(1).query_async(&mut con).await.unwrap();
    for k in pk.task_keys("r") {
        let () = redis::cmd("DEL").arg(k).query_async(&mut con).await.unwrap();
    }
    for set in [pk.index(), pk.lane_tasks("noop")] {
        let () = redis::cmd("ZREM").arg(set).arg("r").query_async(&mut con).await.unwrap();
    }
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let round: Option<u64> = redis::cmd("HGET").arg(pk.task("r")).arg("round").query_async(&mut con).await.unwrap();
    assert_eq!(round, Some(3), "the recreated share runs in its home's round");
}

/// Survey (a fix no test saw undone): `retry.lua` refuses a share it must not retry (here a
/// cancelled one) before its first write: the share keeps its round.
#[tokio::test]
async fn a_refused_retry_of_a_share_leaves_its_round() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "refused-retry").await;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("c", "noop", 4)).await.unwrap();
    let pk = layout.partitions[0].clone();
    shardctl_common::control::cancel_in(&mut con, &pk, "c").await.unwrap();
    let before: Option<String> = redis::cmd("HGET").arg(pk.task("c")).arg("round").query_async(&mut con).await.unwrap();
    let r = shardctl_common::retry::retry_in_round(&mut con, &pk, "c", Some(7)).await;
    assert!(r.is_err(), "a cancelled share is not retried: {r:?}");
    let after: Option<String> = redis::cmd("HGET").arg(pk.task("c")).arg("round").query_async(&mut con).await.unwrap();
    assert_eq!(before, after, "a refused retry writes nothing");
}

/// Survey (a fix no test saw undone): a share counted in an older round and reported from a
/// newer one (the home lost the reopen that forgot its count, then took the round back from
/// another share's report) replaces its count: the home's sums never keep the stale one.
#[tokio::test]
async fn a_count_of_an_older_round_is_replaced_by_the_newer_report() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "older-count").await;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("o", "noop", 4)).await.unwrap();
    let home = layout.home.clone();
    let inc = share::home_inc_of(&mut con, &home, "o").await.unwrap().unwrap();
    // share 1 was counted 1/1 in round 1; the home is in round 2 now
    let () = redis::cmd("HSET")
        .arg(home.task("o"))
        .arg(&["part:1", "1/1", "round:1", "1", "done", "1", "failed", "1", "round", "2"])
        .query_async(&mut con)
        .await
        .unwrap();
    let r = scripts::ShareReport {
        task: "o".into(),
        home_inc: inc,
        partition: 1,
        round: 2,
        done: 2,
        failed: 0,
        ..Default::default()
    };
    assert_eq!(scripts::report(&mut con, &home, &r).await.unwrap(), scripts::Reported::Counted);
    let (part, done, failed): (String, u64, u64) =
        redis::cmd("HMGET").arg(home.task("o")).arg(&["part:1", "done", "failed"]).query_async(&mut con).await.unwrap();
    assert_eq!((part.as_str(), done, failed), ("2/0", 2, 0), "the newer count replaced the older one");
}

/// Survey (a fix no test saw undone): a keyed share lost with only part of its keys (its
/// dispatcher died while writing them, or its partition lost the rest) is not recreated to run
/// without them: the reconciliation cancels its task, saying why.
#[tokio::test]
async fn a_keyed_share_whose_keys_are_incomplete_cancels_its_task() {
    let redis = TestRedis::start();
    let (mut con, layout) = queue(&redis, "keys-incomplete").await;
    let mut spec = TaskSpec::new("k", "noop", 4);
    spec.strategy = shardctl_common::ring::Strategy::ConsistentHash;
    spec.has_keys = true;
    let keys: Vec<String> = (0..4).map(|i| format!("user-{i}")).collect();
    shardctl_coordinator::partition::dispatch_keyed(&mut con, &layout, &spec, &keys).await.unwrap();
    let (home, pk) = (layout.home.clone(), layout.partitions[1].clone());
    // the share's record is gone, and one of its two keys with it
    let () = redis::cmd("DEL").arg(pk.task("k")).query_async(&mut con).await.unwrap();
    for set in [pk.index(), pk.lane_tasks("noop"), pk.unrouted()] {
        let () = redis::cmd("ZREM").arg(set).arg("k").query_async(&mut con).await.unwrap();
    }
    let () = redis::cmd("HDEL").arg(pk.shard_keys("k")).arg(1).query_async(&mut con).await.unwrap();
    let () = redis::cmd("HSET").arg(home.task("k")).arg("created_ms").arg(1).query_async(&mut con).await.unwrap();
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let state: String = redis::cmd("HGET").arg(home.task("k")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "cancelled", "a keyed share is never run without its keys");
}

/// Survey: the range checks hold below the command line too: `TaskSpec::validate` (every
/// dispatch of the library) and the dispatch script itself refuse a retention past 100 years,
/// before anything is written.
#[tokio::test]
async fn out_of_range_retention_is_refused_by_the_library_and_the_script() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "retain").unwrap();
    let mut spec = TaskSpec::new("r", "noop", 2);
    spec.retain = Some(Duration::from_secs(300_000_000 * 365 * 24 * 3600));
    let e = shardctl_coordinator::dispatch::create_task(&mut con, &home, &spec).await.unwrap_err();
    assert!(e.to_string().contains("retention"), "{e}");
    // the script checks it too (a caller that skips validate)
    assert!(scripts::dispatch(&mut con, &home, &spec).await.is_err());
    let n: u64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert_eq!(n, 0, "nothing written");
}
