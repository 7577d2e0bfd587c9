//! Partitioned queues (docs/design/partitions.md): a task split over K partitions of
//! one queue, each share in a hash slot of its own, counted one level up in the home exactly
//! once. The crash rounds over partitions (with SIGKILL, SIGSTOP and SIGTERM, on one server and
//! on a 3-master cluster) are in tests/crash.rs; this file checks the rest through the binary
//! and, for the report that a crash cuts between two slots, through the library.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::time::Duration;

use serde_json::{json, Value};
use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::partition::{self, Layout};
use shardctl_common::scripts::{self, ClaimRequest, Finished, FinishedAs, Reported, ShareReport};
use shardctl_common::{Home, Keys};
use shardctl_testkit::{TestCluster, TestRedis};
use support::Cli;

/// Claims every shard of partition `pk` there is (claim call `seq` of one simulated executor)
/// and completes them, or fails them for good (`fail`), as an executor would.
async fn run_share(con: &mut redis::aio::MultiplexedConnection, pk: &Keys, seq: u64, fail: bool) {
    let req = ClaimRequest {
        count: 10,
        lock_ms: 60_000,
        instance: "e1",
        seq,
        node: "n1",
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let claimed = scripts::claim(con, pk, &req).await.unwrap().shards;
    let outcome = if fail {
        FinishedAs::Failed { delay_ms: 0, reason: "boom", failure: shardctl_common::failure::Failure::Retry }
    } else {
        FinishedAs::Completed("")
    };
    let all: Vec<Finished<'_>> =
        claimed.iter().map(|c| Finished { claim: c, outcome: outcome.clone(), ran_ms: None }).collect();
    scripts::finish(con, pk, "n1", &all).await.unwrap();
}

/// The prefixes of the queue's partitions, from `config --json`.
fn partition_prefixes(cli: &Cli) -> Vec<String> {
    let v = cli.json(&["config", "--json"], 0);
    v["partition_tags"].as_array().unwrap().iter().map(|t| format!("{{{}}}:", t.as_str().unwrap())).collect()
}

/// A `primes` task over 3 partitions of one server: the exact result (each share's handler sees
/// the task's own indexes and item ranges), the counts in the home, one share per partition
/// with its own base, every share reported once.
#[test]
fn a_task_over_three_partitions_sums_exactly_and_is_counted_once() {
    let cli = Cli::start("parts");
    let cfg = cli.json(&["config", "--partitions", "3", "--json"], 0);
    assert_eq!(cfg["partitions"], json!(3), "{cfg}");
    let prefixes = partition_prefixes(&cli);
    assert_eq!(prefixes.len(), 3);
    assert_eq!(prefixes[0], "{shardctl:parts@1.0}:");
    let _a = cli.executor("pa", &[]);
    let _b = cli.executor("pb", &[]);
    // 1000 shards over the items 0..100000: a share running its own indexes would count the
    // primes of the first third three times
    cli.ok(&["dispatch", "--kind", "primes", "--shards", "1000", "--items", "100000", "--task-id", "s"]);
    let t = cli.json(&["wait", "s", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["state"], json!("completed"), "{t}");
    assert_eq!(t["partitions"], json!(3), "{t}");
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64(), t["total"].as_u64()), (Some(1000), Some(0), Some(1000)));
    assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}");
    let mut con = cli.con();
    let mut bases = Vec::new();
    for (p, prefix) in prefixes.iter().enumerate() {
        let share: (u64, u64, u64, String) = redis::cmd("HMGET")
            .arg(format!("{prefix}task:s"))
            .arg(&["base", "total", "done", "state"])
            .query(&mut con)
            .unwrap();
        assert_eq!(share.1, share.2, "share {} not all done: {share:?}", p + 1);
        // ended: waiting for its home, or (soon after the home) ended as it (end_share.lua)
        assert!(matches!(share.3.as_str(), "aggregating" | "completed"), "share {}: {share:?}", p + 1);
        bases.push((share.0, share.1));
        let bits: u64 = redis::cmd("BITCOUNT").arg(format!("{prefix}task:s:terminal")).query(&mut con).unwrap();
        assert_eq!(bits, share.1);
        let unreported: u64 = redis::cmd("ZCARD").arg(format!("{prefix}unreported")).query(&mut con).unwrap();
        assert_eq!(unreported, 0, "partition {} still has a report pending", p + 1);
    }
    assert_eq!(bases, [(0, 334), (334, 333), (667, 333)]);
    // the home counted each share once, with its counts
    let parts: Vec<Option<String>> =
        redis::cmd("HMGET").arg(cli.key("task:s")).arg(&["part:1", "part:2", "part:3"]).query(&mut con).unwrap();
    assert_eq!(parts, [Some("334/0".into()), Some("333/0".into()), Some("333/0".into())]);
    let events: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(cli.key("events"))
        .arg("-")
        .arg("+")
        .query::<Vec<(String, std::collections::HashMap<String, String>)>>(&mut con)
        .unwrap()
        .into_iter()
        .map(|(id, m)| (id, m.into_iter().collect()))
        .collect();
    let kinds: Vec<String> =
        events.iter().filter_map(|(_, f)| f.iter().find(|(k, _)| k == "event").map(|(_, v)| v.clone())).collect();
    assert_eq!(kinds.iter().filter(|k| *k == "share_counted").count(), 3, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "task_aggregating").count(), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "task_completed").count(), 1, "{kinds:?}");
    // status lists the task once, from its home
    let st = cli.json(&["status", "--json"], 0);
    let listed: Vec<&Value> = st["recent"].as_array().unwrap().iter().filter(|t| t["task_id"] == json!("s")).collect();
    assert_eq!(listed.len(), 1, "{st}");
}

/// Failed shards are counted in their shares and reach the home; fewer shards than partitions
/// leave the extra partitions without a share.
#[test]
fn failures_and_tiny_tasks_over_partitions() {
    let cli = Cli::start("parts-fail");
    cli.ok(&["config", "--partitions", "4"]);
    let _a = cli.executor("pf", &[]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--shards",
        "10",
        "--attempts",
        "1",
        "--task-id",
        "f",
        "--payload",
        r#"{"rate":1}"#,
    ]);
    let t = cli.json(&["wait", "f", "--timeout", "60s", "--json"], 3);
    assert_eq!(
        (t["state"].as_str(), t["failed"].as_u64(), t["done"].as_u64()),
        (Some("failed"), Some(10), Some(0)),
        "{t}"
    );
    // every share's reasons, at the task's own indexes
    let failed = cli.json(&["status", "f", "--failed", "--json"], 0);
    let shards: Vec<u64> = failed.as_array().unwrap().iter().map(|f| f["shard"].as_u64().unwrap()).collect();
    assert_eq!(shards, (0..10).collect::<Vec<_>>(), "{failed}");
    // 2 shards over 4 partitions: two shares, and the task still ends
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "tiny"]);
    let t = cli.json(&["wait", "tiny", "--timeout", "60s", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64()), (Some("completed"), Some(2)), "{t}");
    let mut con = cli.con();
    let shares: Vec<bool> = partition_prefixes(&cli)
        .iter()
        .map(|p| redis::cmd("EXISTS").arg(format!("{p}task:tiny")).query(&mut con).unwrap())
        .collect();
    assert_eq!(shares.iter().filter(|e| **e).count(), 2, "{shares:?}");
}

/// What a partitioned queue refuses, clearly and without writing: a bad count, a change of
/// count while a task runs over partitions, shard keys for a pull task. (A keys file over
/// partitions works: tests/routing.rs.)
#[test]
fn a_partitioned_queue_refuses_what_it_cannot_do() {
    let cli = Cli::start("parts-refuse");
    cli.rejects(&["config", "--partitions", "0"], 2, "partitions must be 1 to 64");
    cli.rejects(&["config", "--partitions", "65"], 2, "partitions must be 1 to 64");
    cli.ok(&["config", "--partitions", "2"]);
    let keys = std::env::temp_dir().join(format!("shardctl-parts-keys-{}", std::process::id()));
    std::fs::write(&keys, "a\nb\nc\n").unwrap();
    cli.rejects(
        &["dispatch", "--kind", "noop", "--keys-file", keys.to_str().unwrap(), "--strategy", "pull"],
        2,
        "--keys-file needs a routed --strategy",
    );
    // a task running over the partitions pins the count (no executor: it stays running)
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "4", "--task-id", "pinned"]);
    cli.rejects(&["config", "--partitions", "3"], 2, "runs over 2 partitions");
    // the same count again changes nothing and is fine
    cli.ok(&["config", "--partitions", "2"]);
}

/// Pause, resume and cancel reach every partition; clean removes the shares with their task.
#[test]
fn controls_reach_every_partition() {
    let cli = Cli::start("parts-ctl");
    cli.ok(&["config", "--partitions", "3"]);
    cli.ok(&["pause"]);
    let mut con = cli.con();
    let prefixes = partition_prefixes(&cli);
    for p in &prefixes {
        let paused: Option<String> = redis::cmd("HGET").arg(format!("{p}meta")).arg("paused").query(&mut con).unwrap();
        assert_eq!(paused.as_deref(), Some("1"), "{p} not paused");
    }
    let _a = cli.executor("pc", &[]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "30", "--task-id", "held"]);
    std::thread::sleep(Duration::from_millis(800));
    let t = cli.json(&["status", "held", "--json"], 0);
    assert_eq!(t["done"], json!(0), "claimed while paused: {t}");
    cli.ok(&["resume"]);
    let t = cli.json(&["wait", "held", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["done"], json!(30), "{t}");

    // a long task cancelled: every share stops and nothing more is claimed
    cli.ok(&["dispatch", "--kind", "sleep", "--shards", "300", "--payload", r#"{"ms":200}"#, "--task-id", "long"]);
    std::thread::sleep(Duration::from_millis(700));
    cli.ok(&["cancel", "long"]);
    let t = cli.json(&["wait", "long", "--timeout", "30s", "--json"], 4);
    assert_eq!(t["state"], json!("cancelled"), "{t}");
    for p in &prefixes {
        let state: Option<String> =
            redis::cmd("HGET").arg(format!("{p}task:long")).arg("state").query(&mut con).unwrap();
        assert_eq!(state.as_deref(), Some("cancelled"), "share in {p}");
    }
    // clean removes the tasks and their shares, in every partition
    cli.ok(&["clean", "--older-than", "0s"]);
    for p in &prefixes {
        for id in ["held", "long"] {
            let n: u64 = redis::cmd("EXISTS").arg(format!("{p}task:{id}")).query(&mut con).unwrap();
            assert_eq!(n, 0, "share {id} left in {p}");
        }
        let idx: u64 = redis::cmd("ZCARD").arg(format!("{p}index")).query(&mut con).unwrap();
        assert_eq!(idx, 0, "{p} index");
    }
}

/// On a 3-master cluster the partitions land on the three masters, distinct from one another;
/// when a slot moves two of them onto one master, a coordinator re-places them over the three
/// (new tags: the keys of a partition are never moved), and a running executor follows.
#[test]
fn on_a_cluster_partitions_land_on_distinct_masters_and_are_re_placed_when_slots_move() {
    let cluster = TestCluster::start(3);
    let cli = Cli::on((), &cluster.url(), "parts-spread");
    let owners = |v: &Value| -> Vec<u16> {
        v["partition_tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| cluster.owner(cluster.keyslot(&format!("{{{}}}", t.as_str().unwrap()))))
            .collect()
    };
    let distinct = |o: &[u16]| o.iter().collect::<std::collections::BTreeSet<_>>().len();
    let v = cli.json(&["config", "--partitions", "3", "--json"], 0);
    let first = owners(&v);
    assert_eq!(distinct(&first), 3, "{v}");
    let mut exec = cli.executor("pspread", &[]);
    // partition 2's slot moved onto partition 1's master: one master holds two, one none
    let tag2 = v["partition_tags"][1].as_str().unwrap().to_owned();
    cluster.migrate_slot(cluster.keyslot(&format!("{{{tag2}}}")), first[0]);
    assert_eq!(distinct(&owners(&v)), 2);
    // a coordinator checks where they lie when it starts (then every 30 s): re-placed
    let mut coord = cli.background("coord", &["coordinator", "--metrics-addr", "off", "--ui-addr", "off"]);
    let placed = support::eventually("the partitions re-placed", Duration::from_secs(30), || {
        let now = cli.json(&["config", "--json"], 0);
        match distinct(&owners(&now)) == 3 && now["partition_tags"] != v["partition_tags"] {
            true => Ok(now),
            false => Err(format!("{now}\n{}", coord.log())),
        }
    });
    assert_eq!(placed["partitions"], json!(3), "{placed}");
    // `config` says where each partition lies
    let said: Vec<String> = owners(&placed).iter().map(|port| format!("127.0.0.1:{port}")).collect();
    assert_eq!(placed["partition_masters"], json!(said), "{placed}");
    // the executor started before follows: a task runs over the new partitions
    cli.ok(&["dispatch", "--kind", "primes", "--shards", "30", "--items", "100000", "--task-id", "moved"]);
    let t = cli.json(&["wait", "moved", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}\n{}", exec.log());
    let record = "{shardctl:parts-spread}:task:moved";
    let tags: String = redis::cmd("HGET")
        .arg(record)
        .arg("partition_tags")
        .query(&mut cluster.node_con(cluster.owner(cluster.keyslot(record))))
        .unwrap();
    let placed_tags: Vec<&str> =
        placed["partition_tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tags, placed_tags.join(" "));
    assert!(coord.terminate().success(), "{}", coord.log());
    assert!(exec.terminate().success(), "{}", exec.log());
}

/// The report is the step a crash can cut between two slots: a share ended in its partition,
/// its process gone before the home counted it. Whoever repeats the pending reports (every
/// executor and coordinator, every 200 ms) counts it once; a repeated or stale report counts
/// nothing; the aggregation job is enqueued once.
#[tokio::test]
async fn a_report_lost_between_two_slots_is_repeated_and_counted_once() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "lost-report").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    let spec = TaskSpec::new("r", "noop", 5);
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    // run every shard of both shares by hand, as an executor would, and "die" before reporting
    for pk in &layout.partitions {
        run_share(&mut con, pk, 1, false).await;
    }
    let url = redis.url();
    let home_state = || {
        let (url, home) = (url.clone(), home.clone());
        async move {
            let mut c = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
            let (state, done): (String, u64) =
                redis::cmd("HMGET").arg(home.task("r")).arg(&["state", "done"]).query_async(&mut c).await.unwrap();
            let wait: Vec<String> =
                redis::cmd("LRANGE").arg(home.lane_wait("noop")).arg(0).arg(-1).query_async(&mut c).await.unwrap();
            (state, done, wait)
        }
    };
    // both shares ended, nothing counted in the home yet
    assert_eq!(home_state().await, ("running".into(), 0, vec![]));
    for pk in &layout.partitions {
        let n: u64 = redis::cmd("ZCARD").arg(pk.unreported()).query_async(&mut con).await.unwrap();
        assert_eq!(n, 1);
    }
    // a report counted but never acknowledged (the crash came between the two slots' writes)
    let inc = shardctl_common::share::home_inc_of(&mut con, &home, "r").await.unwrap().unwrap();
    let r = ShareReport {
        task: "r".into(),
        home_inc: inc.clone(),
        partition: 1,
        round: 0,
        done: 3,
        failed: 0,
        ..Default::default()
    };
    assert_eq!(scripts::report(&mut con, &home, &r).await.unwrap(), Reported::Counted);
    assert_eq!(scripts::report(&mut con, &home, &r).await.unwrap(), Reported::Already, "counted twice");
    // a report of another incarnation counts nothing, not even one of the same seq (a home
    // whose master lost its dispatch hands the seq out again); one of a round ahead says the
    // home lost a reopen
    let ahead = ShareReport { round: 7, partition: 2, ..r.clone() };
    assert_eq!(scripts::report(&mut con, &home, &ahead).await.unwrap(), Reported::HomeBehind);
    let seq = inc.split('.').next().unwrap().to_owned();
    for other in [format!("{seq}.0000000000000000"), seq, "99".to_owned()] {
        let other = ShareReport { home_inc: other, partition: 2, ..r.clone() };
        assert_eq!(scripts::report(&mut con, &home, &other).await.unwrap(), Reported::Already);
    }
    assert_eq!(home_state().await, ("running".into(), 3, vec![]));
    // the repeat: share 1 counts nothing more (and is acknowledged), share 2 counts now
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 1);
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 0);
    for pk in &layout.partitions {
        let n: u64 = redis::cmd("ZCARD").arg(pk.unreported()).query_async(&mut con).await.unwrap();
        assert_eq!(n, 0, "acknowledged");
    }
    let (state, done, wait) = home_state().await;
    assert_eq!((state.as_str(), done), ("aggregating", 5));
    assert_eq!(wait, ["r:1:agg"], "the aggregation job enqueued once");
}

/// A failover of the home's master can lose a count (replication is asynchronous) that the
/// partition has already acknowledged: the reconciliation finds the ended share without its
/// count in the home and reports it again, once.
#[tokio::test]
async fn a_count_lost_in_the_home_after_its_acknowledgement_is_reported_again() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "lost-count").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("r", "noop", 4)).await.unwrap();
    let pk = &layout.partitions[0];
    run_share(&mut con, pk, 1, false).await;
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 1);
    // the home's master failed over and its replica had not received the count
    let () = redis::cmd("HDEL").arg(home.task("r")).arg("part:1").query_async(&mut con).await.unwrap();
    let () = redis::cmd("HSET").arg(home.task("r")).arg("done").arg(0).query_async(&mut con).await.unwrap();
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 0, "acknowledged");
    assert_eq!(shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap(), 1);
    assert_eq!(shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap(), 0);
    let done: u64 = redis::cmd("HGET").arg(home.task("r")).arg("done").query_async(&mut con).await.unwrap();
    assert_eq!(done, 2, "share 1's two shards, counted once");
}

/// `retry` of a task over partitions runs the failed shards of every share again, in a new
/// round, until the task completes; each round's counts replace the last in the home.
#[test]
fn retry_over_partitions_runs_the_failed_shards_again_until_done() {
    let cli = Cli::start("parts-retry");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("pr", &[]);
    let payload = r#"{"rate":0.5}"#;
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        payload,
        "--shards",
        "60",
        "--attempts",
        "1",
        "--task-id",
        "rt",
    ]);
    let t = cli.json(&["wait", "rt", "--timeout", "60s", "--json"], 3);
    let mut failed = t["failed"].as_u64().unwrap();
    assert!(failed > 0 && failed < 60, "{t}");
    let mut rounds = 0;
    while failed > 0 {
        rounds += 1;
        assert!(rounds <= 30, "still {failed} failed after 30 retries");
        let said = cli.ok(&["retry", "rt"]);
        assert!(said.contains(&format!("{failed} failed shards queued again")), "{said}");
        let out = cli.run(&["wait", "rt", "--timeout", "60s", "--json"]);
        let t: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert!(t["state"] == json!("failed") || t["state"] == json!("completed"), "{t}");
        assert_eq!(t["done"].as_u64().unwrap() + t["failed"].as_u64().unwrap(), 60, "{t}");
        failed = t["failed"].as_u64().unwrap();
        if failed == 0 {
            assert_eq!(t["state"], json!("completed"), "{t}");
        }
    }
    let round: u64 = redis::cmd("HGET").arg(cli.key("task:rt")).arg("round").query(&mut cli.con()).unwrap();
    assert_eq!(round, rounds, "one round per retry");
}

/// `retry` of a task over partitions that still runs: the failed shards of shares already
/// counted in the home and of shares still running run again at once, and the task ends with
/// none failed (before, a running task's retry only completed a retry cut short, and said
/// "no failed shards").
#[test]
fn retry_of_a_running_task_over_partitions_runs_its_failed_shards_again() {
    let cli = Cli::start("parts-retry-running");
    cli.ok(&["config", "--partitions", "3"]);
    let dir = std::env::temp_dir().join(format!("shardctl-retry-running-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let go = dir.join("go");
    let _ = std::fs::remove_file(&go);
    let handler = dir.join("handler.sh");
    // every tenth shard fails its first attempt; shards past 20 (the third share) wait for `go`
    std::fs::write(
        &handler,
        format!(
            "#!/bin/sh\ncat >/dev/null\ni=$SHARDCTL_SHARD_INDEX\n\
             if [ $((i % 10)) = 0 ] && [ \"$SHARDCTL_ATTEMPT\" = 1 ]; then exit 3; fi\n\
             if [ $i -gt 20 ]; then while [ ! -e {} ]; do sleep 0.05; done; fi\necho 1\n",
            go.display()
        ),
    )
    .unwrap();
    let mut perms = std::fs::metadata(&handler).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&handler, perms).unwrap();
    let _a = cli.executor("prr", &["--exec", handler.to_str().unwrap(), "--concurrency", "16"]);
    cli.ok(&["dispatch", "--kind", "mine", "--shards", "30", "--attempts", "1", "--task-id", "rr"]);
    // shares 1 and 2 end (counted, one failure each), share 3 runs with one failure
    support::eventually("three failed, two shares counted", Duration::from_secs(30), || {
        let t = cli.json(&["status", "rr", "--json"], 0);
        (t["failed"] == json!(3) && t["done"] == json!(18)).then_some(()).ok_or(t)
    });
    let said = cli.ok(&["retry", "rr"]);
    assert!(said.contains("3 failed shards queued again"), "{said}");
    support::eventually("the failed shards run again", Duration::from_secs(30), || {
        let t = cli.json(&["status", "rr", "--json"], 0);
        (t["failed"] == json!(0) && t["done"] == json!(21) && t["state"] == json!("running")).then_some(()).ok_or(t)
    });
    std::fs::write(&go, "").unwrap();
    let t = cli.json(&["wait", "rr", "--timeout", "60s", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(30), Some(0)),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `status` counts a node's shards in every partition: those it runs (`active`) and the routed
/// ones waiting for it.
#[test]
fn status_counts_a_nodes_shards_in_every_partition() {
    let cli = Cli::start("parts-nodes");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("pn", &["--concurrency", "4"]);
    cli.ok(&["dispatch", "--kind", "sleep", "--shards", "12", "--payload", r#"{"ms":3000}"#, "--task-id", "busy"]);
    support::eventually("the node's active shards", Duration::from_secs(20), || {
        let s = cli.json(&["status", "--json"], 0);
        (s["nodes"][0]["active"] == json!(4) && s["active"] == json!(4)).then_some(()).ok_or(s)
    });
    cli.ok(&["wait", "busy", "--timeout", "60s"]);
    cli.ok(&["pause"]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "30", "--strategy", "consistent-hash", "--task-id", "routed"]);
    support::eventually("the node's routed waiting shards", Duration::from_secs(20), || {
        let s = cli.json(&["status", "--json"], 0);
        (s["nodes"][0]["waiting"] == json!(30) && s["waiting"] == json!(30)).then_some(()).ok_or(s)
    });
    cli.ok(&["resume"]);
    cli.ok(&["wait", "routed", "--timeout", "60s"]);
}

/// `retry` read a running task with a share's failures not yet counted; the share is counted
/// before the retry reopens the home, and the task is aggregating. The reopen chooses the shares
/// to forget itself, atomically with the counts: the late-counted share's failures run again
/// (before, the reopen forgot nothing, withdrew the aggregation and left the task running with
/// every share counted: nothing would ever end it). With no counted failure left (another retry
/// came first), the reopen leaves the task as it is.
#[tokio::test]
async fn a_share_counted_while_a_retry_reads_is_retried_not_stranded() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "retry-race").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    let mut spec = TaskSpec::new("x", "fail", 4);
    spec.attempts = 1;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    run_share(&mut con, &layout.partitions[0], 1, false).await;
    run_share(&mut con, &layout.partitions[1], 1, true).await;
    // both counted (what the retry read had the second uncounted): the aggregation is enqueued
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 2);
    let state: String = redis::cmd("HGET").arg(home.task("x")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "aggregating");
    // the retry's reopen, chosen by the script: the failed share's count goes, the task runs
    let round = scripts::reopen(&mut con, &home, "x", None, &[]).await.unwrap();
    assert_eq!(round, 1);
    let (state, done, failed, p1, p2): (String, u64, u64, Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(home.task("x"))
        .arg(&["state", "done", "failed", "part:1", "part:2"])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((state.as_str(), done, failed, p1.as_deref(), p2), ("running", 2, 0, Some("2/0"), None));
    // the whole retry then ends the task with every shard done
    assert_eq!(
        shardctl_common::retry::retry(&mut con, &home, "x").await.unwrap(),
        2,
        "the failed share's shards run again"
    );
    run_share(&mut con, &layout.partitions[1], 3, false).await;
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 1);
    let (state, done): (String, u64) =
        redis::cmd("HMGET").arg(home.task("x")).arg(&["state", "done"]).query_async(&mut con).await.unwrap();
    assert_eq!((state.as_str(), done), ("aggregating", 4));
    // nothing failed is counted now: a reopen leaves the aggregating task as it is
    assert_eq!(scripts::reopen(&mut con, &home, "x", None, &[]).await.unwrap(), 0);
    let (state, round): (String, u64) =
        redis::cmd("HMGET").arg(home.task("x")).arg(&["state", "round"]).query_async(&mut con).await.unwrap();
    assert_eq!((state.as_str(), round), ("aggregating", 2), "rounds: the reopen above, the retry's");
}

/// A retry cut short after the home record was reopened (the shares not yet retried) is
/// completed by the reconciliation: the shares ended in an older round run again.
#[tokio::test]
async fn a_retry_cut_short_is_completed_by_the_reconciliation() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "cut-retry").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    let mut spec = TaskSpec::new("r", "fail", 4);
    spec.attempts = 1;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    // every shard fails for good; both shares end and are counted
    for pk in &layout.partitions {
        run_share(&mut con, pk, 1, true).await;
    }
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 2);
    // the aggregation runs and records the failure
    let req = ClaimRequest {
        count: 1,
        lock_ms: 60_000,
        instance: "e1",
        seq: 2,
        node: "n1",
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let agg = scripts::claim(&mut con, &home, &req).await.unwrap().shards;
    assert_eq!(agg.len(), 1);
    scripts::finish(
        &mut con,
        &home,
        "n1",
        &[Finished { claim: &agg[0], outcome: FinishedAs::Completed("{}"), ran_ms: None }],
    )
    .await
    .unwrap();
    let state: String = redis::cmd("HGET").arg(home.task("r")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "failed");
    // the retry's first step alone (its process died before the shares' retries)
    let round = scripts::reopen(&mut con, &home, "r", None, &[1, 2]).await.unwrap();
    assert_eq!(round, 1);
    let (state, done, failed): (String, u64, u64) =
        redis::cmd("HMGET").arg(home.task("r")).arg(&["state", "done", "failed"]).query_async(&mut con).await.unwrap();
    assert_eq!((state.as_str(), done, failed), ("running", 0, 0), "the shares' counts forgotten");
    // a late report of the old round counts nothing
    let inc = shardctl_common::share::home_inc_of(&mut con, &home, "r").await.unwrap().unwrap();
    let old = ShareReport {
        task: "r".into(),
        home_inc: inc,
        partition: 1,
        round: 0,
        done: 0,
        failed: 2,
        ..Default::default()
    };
    assert_eq!(scripts::report(&mut con, &home, &old).await.unwrap(), Reported::Already);
    // the reconciliation retries both shares in round 1: their shards are claimable again
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    for pk in &layout.partitions {
        let (state, round): (String, u64) =
            redis::cmd("HMGET").arg(pk.task("r")).arg(&["state", "round"]).query_async(&mut con).await.unwrap();
        assert_eq!((state.as_str(), round), ("running", 1));
        let wait: u64 = redis::cmd("LLEN").arg(pk.lane_wait("fail")).query_async(&mut con).await.unwrap();
        assert_eq!(wait, 2, "the share's failed shards wait to run again");
    }
    // the shares now succeed and report in round 1: the task completes with every shard done
    for pk in &layout.partitions {
        run_share(&mut con, pk, 3, false).await;
    }
    assert_eq!(shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap(), 2);
    let (state, done, failed): (String, u64, u64) =
        redis::cmd("HMGET").arg(home.task("r")).arg(&["state", "done", "failed"]).query_async(&mut con).await.unwrap();
    assert_eq!((state.as_str(), done, failed), ("aggregating", 4, 0));
}

/// One executor serves every partition and the home fairly: no share waits for another's to
/// drain, and the aggregation of a small task runs while a big one holds the executor.
#[test]
fn no_partition_and_no_aggregation_waits_for_another_to_drain() {
    let cli = Cli::start("parts-fair");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("pfair", &[]);
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":2}"#, "--shards", "20000", "--task-id", "big"]);
    let prefixes = partition_prefixes(&cli);
    let mut con = cli.con();
    support::eventually("every share of the big task to progress", Duration::from_secs(30), || {
        let done: Vec<u64> = prefixes
            .iter()
            .map(|p| {
                redis::cmd("HGET")
                    .arg(format!("{p}task:big"))
                    .arg("done")
                    .query::<Option<u64>>(&mut con)
                    .unwrap()
                    .unwrap_or(0)
            })
            .collect();
        if done.iter().all(|d| *d > 0) {
            Ok(())
        } else {
            Err(format!("{done:?}"))
        }
    });
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "30", "--priority", "10", "--task-id", "small"]);
    let t = cli.json(&["wait", "small", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["state"], json!("completed"), "{t}");
    // the small task's aggregation did not wait for the big task's shards to drain
    let big = cli.json(&["status", "big", "--json"], 0);
    assert_eq!(big["state"], json!("running"), "the big task ended first: the test proves nothing: {big}");
    let done = big["done"].as_u64().unwrap() + big["failed"].as_u64().unwrap();
    assert!(done < 10_000, "the small task ended only after {done} of the big task's 20,000 shards");
    cli.ok(&["cancel", "big"]);
}

/// A share that ends long before the others keeps its results until the task ends (the
/// retention counts from the task's end), so the aggregation reads them all.
#[test]
fn an_early_share_outlives_the_retention_until_its_task_ends() {
    let cli = Cli::start("parts-retain");
    cli.ok(&["config", "--partitions", "3"]);
    let prefixes = partition_prefixes(&cli);
    let mut con = cli.con();
    // partition 3 claims nothing for a while
    let () = redis::cmd("HSET").arg(format!("{}meta", prefixes[2])).arg("paused").arg(1).query(&mut con).unwrap();
    let _a = cli.executor("pret", &[]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "primes",
        "--shards",
        "30",
        "--items",
        "100000",
        "--retain",
        "1s",
        "--task-id",
        "r",
    ]);
    support::eventually("shares 1 and 2 to end", Duration::from_secs(30), || {
        let states: Vec<Option<String>> = prefixes[..2]
            .iter()
            .map(|p| redis::cmd("HGET").arg(format!("{p}task:r")).arg("state").query(&mut con).unwrap())
            .collect();
        if states.iter().all(|s| s.as_deref() == Some("aggregating")) {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    });
    std::thread::sleep(Duration::from_millis(2000)); // past the retention
    let () = redis::cmd("HDEL").arg(format!("{}meta", prefixes[2])).arg("paused").query(&mut con).unwrap();
    let () = redis::cmd("ZADD").arg(format!("{}marker", prefixes[2])).arg(0).arg("0").query(&mut con).unwrap();
    let t = cli.json(&["wait", "r", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}");
}

/// A task id whose earlier task's home record went without its shares (a `clean` cut short)
/// dispatches again: the orphaned shares are removed and the new task runs.
#[test]
fn an_id_whose_shares_were_orphaned_is_dispatched_again() {
    let cli = Cli::start("parts-orphan");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("porph", &[]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "9", "--task-id", "o", "--retain", "forever"]);
    cli.json(&["wait", "o", "--timeout", "60s", "--json"], 0);
    let mut con = cli.con();
    for k in ["task:o", "task:o:terminal", "task:o:results"] {
        let () = redis::cmd("DEL").arg(cli.key(k)).query(&mut con).unwrap();
    }
    for z in ["index", "finished"] {
        let () = redis::cmd("ZREM").arg(cli.key(z)).arg("o").query(&mut con).unwrap();
    }
    cli.ok(&["dispatch", "--kind", "primes", "--shards", "9", "--items", "100000", "--task-id", "o"]);
    let t = cli.json(&["wait", "o", "--timeout", "60s", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["result"]["primes"].as_u64()), (Some("completed"), Some(9592)), "{t}");
}

/// Cancel reaches every share even when a partition has none (fewer shards than partitions),
/// and cancelling again completes a cancel cut short.
#[test]
fn cancel_passes_over_partitions_without_a_share() {
    let cli = Cli::start("parts-cancel");
    cli.ok(&["config", "--partitions", "4"]);
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":60000}"#, "--shards", "2", "--task-id", "c"]);
    cli.ok(&["cancel", "c"]);
    let mut con = cli.con();
    let states: Vec<Option<String>> = partition_prefixes(&cli)
        .iter()
        .map(|p| redis::cmd("HGET").arg(format!("{p}task:c")).arg("state").query(&mut con).unwrap())
        .collect();
    assert_eq!(states.iter().flatten().filter(|s| *s == "cancelled").count(), 2, "{states:?}");
    assert_eq!(states.iter().filter(|s| s.is_none()).count(), 2, "{states:?}");
    cli.ok(&["cancel", "c"]);
}

/// A delayed task over partitions says so, then runs.
#[test]
fn a_delayed_task_over_partitions_waits_then_runs() {
    let cli = Cli::start("parts-delay");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("pdel", &[]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "6", "--delay", "3s", "--task-id", "d"]);
    // its shards are counted once as delayed (by its shares, not by its home record as well)
    let q = cli.json(&["status", "--json"], 0);
    assert_eq!(q["delayed"], json!(6), "{q}");
    let t = cli.json(&["status", "d", "--json"], 0);
    assert_eq!(t["state"], json!("delayed"), "{t}");
    let t = cli.json(&["wait", "d", "--timeout", "60s", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64()), (Some("completed"), Some(6)), "{t}");
}

/// An executor started before the queue was partitioned still aggregates tasks over partitions
/// (it reads the partitions when it aggregates).
#[test]
fn an_executor_started_before_the_partitions_aggregates_over_them() {
    let cli = Cli::start("parts-late");
    let mut old = cli.executor("plate-old", &[]);
    std::thread::sleep(Duration::from_millis(500));
    cli.ok(&["config", "--partitions", "3"]);
    let _new = cli.executor("plate-new", &[]);
    for i in 0..6 {
        cli.ok(&["dispatch", "--kind", "primes", "--shards", "9", "--items", "100000", "--task-id", &format!("l{i}")]);
    }
    for i in 0..6 {
        let t = cli.json(&["wait", &format!("l{i}"), "--timeout", "60s", "--json"], 0);
        assert_eq!(t["result"]["primes"], json!(9592), "{t}\n{}", old.log());
    }
    old.terminate();
}

/// Running executors follow every change of the partition count without a restart
/// (docs/design/partitions-repair.md): each task dispatched after a change runs over the
/// new partitions with no executor started since, and a task running in the home across a
/// change ends exactly (its running shards drain, the rest are claimed again by the re-formed
/// runtimes). Before, executors served the layout they started with: a task over partitions
/// nobody served waited forever.
#[test]
fn running_executors_follow_each_change_of_the_count() {
    let cli = Cli::start("parts-follow");
    let mut a = cli.executor("pfa", &[]);
    let mut b = cli.executor("pfb", &[]);
    // both started over the first layout (a slow start could read the changed one instead)
    support::eventually("both executors to start", Duration::from_secs(30), || {
        let started = |e: &support::Process| e.log().contains("executor started") && e.log().contains("partitions=1");
        if started(&a) && started(&b) {
            Ok(())
        } else {
            Err(format!("{}\n{}", a.log(), b.log()))
        }
    });
    // 60 shards of 200 ms on 4 run slots: about 3 s, cut by the first change
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":200}"#, "--shards", "60", "--task-id", "across"]);
    std::thread::sleep(Duration::from_millis(400));
    for (n, (k, id)) in [("3", "f3"), ("2", "f2"), ("1", "f1"), ("4", "f4")].into_iter().enumerate() {
        cli.ok(&["config", "--partitions", k]);
        // each change seen by both (else two quick changes may be followed as one)
        let line = format!("runtimes re-formed for the queue's partitions partitions={k}");
        support::eventually("both executors to re-form", Duration::from_secs(30), || {
            match [&a, &b]
                .iter()
                .all(|e| e.log().matches("runtimes re-formed").count() == n + 1 && e.log().contains(&line))
            {
                true => Ok(()),
                false => Err(format!("{}\n{}", a.log(), b.log())),
            }
        });
        cli.ok(&["dispatch", "--kind", "primes", "--shards", "60", "--items", "100000", "--task-id", id]);
        let t = cli.json(&["wait", id, "--timeout", "60s", "--json"], 0);
        assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}\n{}\n{}", a.log(), b.log());
        assert_eq!(t["partitions"].as_u64(), Some(k.parse().unwrap()), "{t}");
        if id == "f3" {
            let t = cli.json(&["wait", "across", "--timeout", "60s", "--json"], 0);
            let counts = (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64());
            assert_eq!(counts, (Some("completed"), Some(60), Some(0)), "{t}");
        }
    }
    // the same two processes all along
    for e in [&mut a, &mut b] {
        assert!(e.ended().is_none(), "{}", e.log());
    }
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}

/// A dispatch that read the layout before a change is refused by the home (`create_task`:
/// LayoutChanged) and leaves nothing behind; the coordinator's dispatch reads it again and
/// dispatches over the new partitions. The change itself is refused while a task over
/// partitions runs, whoever checks.
#[tokio::test]
async fn a_task_is_never_created_over_partitions_a_change_retired() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "stale").unwrap();
    let two = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    partition::set_count(&mut con, &home, 3, false).await.unwrap();
    let spec = TaskSpec::new("late", "noop", 9);
    let err = shardctl_coordinator::partition::dispatch(&mut con, &two, &spec).await.unwrap_err();
    assert!(matches!(err, shardctl_common::Error::Script(shardctl_common::ScriptCode::LayoutChanged)), "{err:?}");
    let exists: bool = redis::cmd("EXISTS").arg(home.task("late")).query_async(&mut con).await.unwrap();
    assert!(!exists, "a refused dispatch left a record");
    shardctl_coordinator::dispatch::create_task(&mut con, &home, &spec).await.unwrap();
    let tags: String =
        redis::cmd("HGET").arg(home.task("late")).arg("partition_tags").query_async(&mut con).await.unwrap();
    assert_eq!(tags.split_whitespace().count(), 3, "{tags}");
    // the task runs over partitions: no change of the count now
    let err = partition::set_count(&mut con, &home, 1, false).await.unwrap_err();
    assert!(err.to_string().contains("task 'late' runs over 3 partitions"), "{err}");
    let after = partition::layout(&mut con, &home).await.unwrap();
    assert_eq!(after.count(), 3);
}

/// A task of shard keys over partitions whose id was used before (the earlier task's removal
/// cut short, its shares left): the leftover shares go, with their keys, before the new ones and
/// their keys are written; each share keeps its own keys at its own indexes.
#[tokio::test]
async fn keyed_shares_replace_leftovers_with_their_own_keys() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "keyed").unwrap();
    let layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    let mut spec = TaskSpec::new("k", "noop", 5);
    spec.strategy = shardctl_common::ring::Strategy::ConsistentHash;
    spec.has_keys = true;
    let old: Vec<String> = (0..5).map(|i| format!("old-{i}")).collect();
    shardctl_coordinator::partition::dispatch_keyed(&mut con, &layout, &spec, &old).await.unwrap();
    // the home record goes, its shares stay (a removal cut short)
    let () = redis::cmd("DEL").arg(home.task("k")).query_async(&mut con).await.unwrap();
    let new: Vec<String> = (0..5).map(|i| format!("new-{i}")).collect();
    shardctl_coordinator::partition::dispatch_keyed(&mut con, &layout, &spec, &new).await.unwrap();
    // shares of 3 and 2 shards: their own keys at their own indexes
    for (pk, want) in layout.partitions.iter().zip([&new[..3], &new[3..]]) {
        let keys: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(pk.shard_keys("k")).query_async(&mut con).await.unwrap();
        // (and the incarnation they belong to, what `drop_orphans` judges them by)
        let inc = shardctl_common::share::home_inc_of(&mut con, &home, "k").await.unwrap();
        assert_eq!(keys.get("inc"), inc.as_ref());
        let mut keys: Vec<String> = keys.into_iter().filter(|(f, _)| f != "inc").map(|(_, v)| v).collect();
        keys.sort();
        assert_eq!(keys, want, "{}", pk.prefix());
        let first: String = redis::cmd("HGET").arg(pk.shard_keys("k")).arg(0).query_async(&mut con).await.unwrap();
        assert_eq!(first, want[0]);
    }
    // without its keys, a keyed task is refused
    let err = shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap_err();
    assert!(err.to_string().contains("dispatched with its keys"), "{err}");
}

/// Lost writes the reconciliation repairs: a share whose creation was lost is created again
/// (once its dispatch is over: never under a live dispatch lease), and a cancel lost in the
/// home is completed from its cancelled share.
#[tokio::test]
async fn the_reconciliation_recreates_lost_shares_and_completes_lost_cancels() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "lost-share").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("m", "noop", 4)).await.unwrap();
    let pk = &layout.partitions[1];
    for k in pk.task_keys("m") {
        let () = redis::cmd("DEL").arg(k).query_async(&mut con).await.unwrap();
    }
    let () = redis::cmd("ZREM").arg(pk.index()).arg("m").query_async(&mut con).await.unwrap();
    let () = redis::cmd("ZREM").arg(pk.lane_tasks("noop")).arg("m").query_async(&mut con).await.unwrap();
    // while its dispatcher holds the lease it may still be on its way, however long: left alone
    let () = redis::cmd("HDEL").arg(home.task("m")).arg("dispatched").query_async(&mut con).await.unwrap();
    let () = redis::cmd("HSET")
        .arg(home.task("m"))
        .arg("dispatch_until")
        .arg(u64::MAX / 4)
        .query_async(&mut con)
        .await
        .unwrap();
    let () = redis::cmd("HSET").arg(home.task("m")).arg("created_ms").arg(1).query_async(&mut con).await.unwrap();
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let n: u64 = redis::cmd("EXISTS").arg(pk.task("m")).query_async(&mut con).await.unwrap();
    assert_eq!(n, 0);
    // its lease lapsed (its dispatcher died): created again, for the same incarnation, runnable
    let () = redis::cmd("HSET").arg(home.task("m")).arg("dispatch_until").arg(1).query_async(&mut con).await.unwrap();
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let (total, base, home_inc): (u64, u64, String) =
        redis::cmd("HMGET").arg(pk.task("m")).arg(&["total", "base", "home_inc"]).query_async(&mut con).await.unwrap();
    let inc = shardctl_common::share::home_inc_of(&mut con, &home, "m").await.unwrap().unwrap();
    assert_eq!((total, base, home_inc), (2, 2, inc));
    let runnable: Option<f64> =
        redis::cmd("ZSCORE").arg(pk.lane_tasks("noop")).arg("m").query_async(&mut con).await.unwrap();
    assert!(runnable.is_some());
    // a cancel whose home write was lost: the share is cancelled, the home still running
    shardctl_common::control::cancel_in(&mut con, &layout.partitions[0], "m").await.unwrap();
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let state: String = redis::cmd("HGET").arg(home.task("m")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "cancelled");
    let state: String = redis::cmd("HGET").arg(pk.task("m")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "cancelled", "and every share with it");
}

/// The aggregation never reads a share that lost writes after it was counted (a failover of its
/// partition's master: the replica lacks the last completion, whose shard is still held under
/// its claim there). It forgets the share's count (`uncount.lua`, event `share_uncounted`); the
/// lost shard is recovered by the sweep and runs again, the share ends and is counted anew, and
/// the aggregation runs once over complete results: the exact prime count, nothing counted
/// twice. Before, the task ended failed until someone retried it.
#[test]
fn a_share_that_lost_writes_after_its_count_runs_again_and_the_task_ends_exactly() {
    let cli = Cli::start("parts-lost");
    cli.ok(&["config", "--partitions", "2"]);
    let prefixes = partition_prefixes(&cli);
    let mut con = cli.con();
    // the home claims nothing: the aggregation job waits
    let () = redis::cmd("HSET").arg(cli.key("meta")).arg("paused").arg(1).query(&mut con).unwrap();
    let _a = cli.executor("plost", &[]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "primes",
        "--shards",
        "8",
        "--items",
        "100000",
        "--attempts",
        "1",
        "--task-id",
        "x",
    ]);
    support::eventually("both shares counted", Duration::from_secs(30), || {
        let s: Option<String> = redis::cmd("HGET").arg(cli.key("task:x")).arg("state").query(&mut con).unwrap();
        if s.as_deref() == Some("aggregating") {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });
    // share 1's master fails over and its replica lacks the last completion: shard 3 is still
    // held there by its claim, whose executor has no lease (it completed it)
    support::lose_a_counted_completion(&mut con, &prefixes[0], "x", 3);
    let () = redis::cmd("HDEL").arg(cli.key("meta")).arg("paused").query(&mut con).unwrap();
    let () = redis::cmd("ZADD").arg(cli.key("marker")).arg(0).arg("0").query(&mut con).unwrap();
    let t = cli.json(&["wait", "x", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}");
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(8), Some(0)), "{t}");
    // the home's log
    let events: Vec<(String, std::collections::HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(cli.key("events")).arg("-").arg("+").query(&mut con).unwrap();
    let of = |k: &str| events.iter().filter(|(_, f)| f["event"] == k).map(|(_, f)| f.clone()).collect::<Vec<_>>();
    let uncounted = of("share_uncounted");
    assert_eq!(uncounted.len(), 1, "{events:?}");
    assert_eq!((uncounted[0]["partition"].as_str(), uncounted[0]["done"].as_str()), ("1", "4"));
    assert_eq!(of("share_counted").len(), 3, "share 1 counted twice, share 2 once: {events:?}");
    assert_eq!(of("task_completed").len(), 1, "{events:?}");
}

/// A change of the count leaves ended tasks readable where their shares are (the home record
/// keeps its partitions' tags), and `clean` empties the partitions no longer in use, then
/// removes their keys.
#[test]
fn a_change_of_the_count_keeps_ended_tasks_readable_and_cleans_retired_partitions() {
    let cli = Cli::start("parts-change");
    cli.ok(&["config", "--partitions", "3"]);
    let old = partition_prefixes(&cli);
    let _a = cli.executor("pchg", &[]);
    let payload = r#"{"rate":0.5}"#;
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        payload,
        "--shards",
        "12",
        "--attempts",
        "1",
        "--task-id",
        "a",
    ]);
    let t = cli.json(&["wait", "a", "--timeout", "60s", "--json"], 3);
    let failed = t["failed"].as_u64().unwrap();
    // refused while a task over partitions runs: nothing written, not even the new partitions'
    // settings (the limit split over 2 would raise what partitions 1 and 2 may start)
    cli.ok(&["limit", "--max", "90", "--per", "1s"]);
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":100}"#, "--shards", "60", "--task-id", "busy"]);
    let refused = cli.run(&["config", "--partitions", "2"]);
    assert_eq!(refused.code(), 2, "{refused:?}");
    assert!(refused.stderr.contains("task 'busy' runs over 3 partitions"), "{refused:?}");
    let mut con = cli.con();
    let limit: u64 = redis::cmd("HGET").arg(format!("{}meta", old[0])).arg("limit_max").query(&mut con).unwrap();
    assert_eq!(limit, 30);
    cli.ok(&["limit", "--off"]);
    cli.json(&["wait", "busy", "--timeout", "60s", "--json"], 0);
    cli.ok(&["config", "--partitions", "2"]);
    // the end of `busy` has been passed on to its shares (the home's `unreported` is gone),
    // so that nothing else writes while the refusal below is checked for writing nothing
    let home_unreported = "{shardctl:parts-change}:unreported";
    support::eventually("busy's shares ended as their home", Duration::from_secs(30), || {
        let n: u64 = redis::cmd("EXISTS").arg(home_unreported).query(&mut con).unwrap();
        if n == 0 {
            Ok(())
        } else {
            Err("the home's unreported is still there")
        }
    });
    // a retry of a task over partitions no longer served: refused, saying why
    cli.rejects(&["retry", "a"], 2, "ran over partitions the queue no longer has");
    // still read over its own three partitions
    let reasons = cli.json(&["status", "a", "--failed", "--json"], 0);
    assert_eq!(reasons.as_array().unwrap().len() as u64, failed, "{reasons}");
    // a new task runs over two
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "4", "--task-id", "b"]);
    let t = cli.json(&["wait", "b", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["partitions"], json!(2), "{t}");
    // clean: the third partition, retired, is emptied and its keys go (once the executor's
    // upkeep left it)
    support::eventually("the executor's upkeep to follow", Duration::from_secs(30), || {
        match _a.log().contains("upkeep follows partitions=2") {
            true => Ok(()),
            false => Err(_a.log()),
        }
    });
    cli.ok(&["clean", "--older-than", "0s"]);
    let left: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}*", old[2].replace('{', "\\{").replace('}', "\\}"))).query(&mut con).unwrap();
    assert!(left.is_empty(), "{left:?}");
    let retired: String = redis::cmd("HGET").arg(cli.key("meta")).arg("retired_tags").query(&mut con).unwrap();
    assert_eq!(retired, "");
}

/// A schedule on a partitioned queue fires tasks over its partitions, each fire time once.
#[test]
fn a_schedule_fires_tasks_over_the_partitions() {
    let cli = Cli::start("parts-cron");
    cli.ok(&["config", "--partitions", "3"]);
    let _a = cli.executor("pcron", &[]);
    let mut c =
        cli.background("coord", &["coordinator", "--metrics-addr", "off", "--ui-addr", "off", "--refresh", "200ms"]);
    cli.ok(&["schedule", "add", "tick", "--cron", "* * * * * *", "--shards", "6", "--kind", "noop"]);
    support::eventually("a fired task to complete", Duration::from_secs(30), || {
        let st = cli.json(&["status", "--json"], 0);
        let done: Vec<Value> = st["recent"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["task_id"].as_str().unwrap_or("").starts_with("tick-") && t["state"] == json!("completed"))
            .cloned()
            .collect();
        match done.first() {
            Some(t) => Ok(t.clone()),
            None => Err(format!("{st}")),
        }
    });
    cli.ok(&["schedule", "remove", "tick"]);
    let st = cli.json(&["status", "--json"], 0);
    for t in st["recent"].as_array().unwrap() {
        assert_eq!(t["partitions"], json!(3), "a fired task ran unpartitioned: {t}");
    }
    assert!(c.terminate().success(), "{}", c.log());
}

/// A node whose run slots are all busy claims nothing more, in any partition: the work goes to
/// an idle node (a partition's runtime holding nothing once claimed one whatever the node ran,
/// and sat on it).
#[test]
fn a_busy_node_leaves_new_work_to_an_idle_one() {
    let cli = Cli::start("parts-busy");
    cli.ok(&["config", "--partitions", "2"]);
    let mut busy = cli.executor("pbusy", &["--prefetch", "0"]);
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":600000}"#, "--shards", "2", "--task-id", "long"]);
    support::eventually("the busy node to run both long shards", Duration::from_secs(30), || {
        let t = cli.json(&["status", "long", "--json"], 0);
        let active = cli.json(&["status", "--json"], 0)["active"].as_u64().unwrap_or(0);
        if active == 2 {
            Ok(())
        } else {
            Err(format!("{active} active: {t}"))
        }
    });
    let mut idle = cli.executor("pidle", &[]);
    for i in 0..4 {
        let id = format!("s{i}");
        cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", &id]);
        let t = cli.json(&["wait", &id, "--timeout", "60s", "--json"], 0);
        assert_eq!(t["state"], json!("completed"), "{t}");
    }
    cli.ok(&["cancel", "long"]);
    assert!(busy.terminate().success());
    assert!(idle.terminate().success());
    let claimed = |log: &str| -> u64 {
        log.lines()
            .find(|l| l.contains("executor stopped"))
            .and_then(|l| l.split("claimed=").nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counters in the log:\n{log}"))
    };
    assert_eq!(claimed(&busy.log()), 2, "the busy node claimed more than its two long shards:\n{}", busy.log());
    assert_eq!(claimed(&idle.log()), 4 * 3 + 4, "the idle node ran every small shard and aggregation");
}

/// The reconciliation judges a share by its incarnation: a leftover share of an earlier task
/// under the id (its removal cut short) neither cancels nor counts for a new task of that id.
#[tokio::test]
async fn a_leftover_share_of_an_earlier_task_does_not_touch_a_new_one() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "leftover").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 3, false).await.unwrap();
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("y", "noop", 3)).await.unwrap();
    shardctl_common::control::cancel(&mut con, &home, "y").await.unwrap();
    // the home record goes, its shares' removal is cut short
    for k in home.task_keys("y") {
        let () = redis::cmd("DEL").arg(k).query_async(&mut con).await.unwrap();
    }
    for z in [home.index(), home.finished(), home.expiring()] {
        let () = redis::cmd("ZREM").arg(z).arg("y").query_async(&mut con).await.unwrap();
    }
    // a new y of 2 shards: no share in partition 3, whose leftover (cancelled) share goes
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &TaskSpec::new("y", "noop", 2)).await.unwrap();
    let n: u64 = redis::cmd("EXISTS").arg(layout.partitions[2].task("y")).query_async(&mut con).await.unwrap();
    assert_eq!(n, 0, "the leftover share in partition 3 was removed");
    shardctl_coordinator::partition::reconcile(&mut con, &layout).await.unwrap();
    let state: String = redis::cmd("HGET").arg(home.task("y")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "running", "the new task was cancelled by its predecessor's share");
}

/// A share created after its task was cancelled (the cancel came between the home record and
/// the share) is cancelled at once; a retry of one share in a round runs once.
#[tokio::test]
async fn a_share_created_after_a_cancel_is_cancelled_and_a_round_retries_once() {
    let redis = TestRedis::start();
    let mut con = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let home = Home::new("shardctl", "late-share").unwrap();
    let layout: Layout = partition::set_count(&mut con, &home, 2, false).await.unwrap();
    let spec = TaskSpec::new("z", "noop", 4);
    let mut fields = spec.fields();
    fields.push(("partitions", "2".to_owned()));
    fields.push(("partition_tags", partition::tags_of(&layout)));
    scripts::dispatch_fields(&mut con, &home, &spec, &fields).await.unwrap();
    shardctl_common::control::cancel(&mut con, &home, "z").await.unwrap();
    let inc = shardctl_common::share::home_inc_of(&mut con, &home, "z").await.unwrap().unwrap();
    partition::create_share(&mut con, &home, &layout.partitions[0], 1, 2, &spec, &inc).await.unwrap();
    let state: String =
        redis::cmd("HGET").arg(layout.partitions[0].task("z")).arg("state").query_async(&mut con).await.unwrap();
    assert_eq!(state, "cancelled");

    // a failed task over 2 partitions, reopened in round 1: resuming the retry twice runs its
    // shares once
    let mut spec = TaskSpec::new("f", "fail", 4);
    spec.attempts = 1;
    shardctl_coordinator::partition::dispatch(&mut con, &layout, &spec).await.unwrap();
    for pk in &layout.partitions {
        run_share(&mut con, pk, 1, true).await;
    }
    shardctl_coordinator::partition::report_pending(&mut con, &layout).await.unwrap();
    let round = scripts::reopen(&mut con, &home, "f", None, &[1, 2]).await.unwrap();
    assert_eq!(round, 1);
    assert_eq!(shardctl_common::retry::resume_retries(&mut con, &layout, "f", 1).await.unwrap(), 4);
    assert_eq!(
        shardctl_common::retry::resume_retries(&mut con, &layout, "f", 1).await.unwrap(),
        0,
        "retried twice in one round"
    );
}

/// A partitioned queue that ran routed tasks (one of them cancelled while its shards waited on
/// the list of a node that died), set back to one partition and cleaned, keeps nothing of the
/// retired partitions: neither their `routed-nodes` and `stalled-check` nor a node's `wait`
/// list and marker.
#[test]
fn clean_leaves_nothing_of_retired_partitions_after_routed_tasks() {
    let cli = Cli::start("parts-routed-clean");
    cli.ok(&["config", "--partitions", "3"]);
    let old = partition_prefixes(&cli);
    let mut a = cli.executor("prc", &["--concurrency", "1"]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "30", "--strategy", "consistent-hash", "--task-id", "r1"]);
    cli.json(&["wait", "r1", "--timeout", "60s", "--json"], 0);
    // a routed task cancelled while most of its shards wait on the list of a node that died
    let slow = r#"{"ms":200}"#;
    let args = ["dispatch", "--kind", "sleep", "--payload", slow, "--shards", "60", "--strategy", "consistent-hash"];
    cli.ok(&[&args[..], &["--task-id", "r2"]].concat());
    support::eventually("r2 under way", Duration::from_secs(30), || {
        let t = cli.json(&["status", "r2", "--json"], 0);
        (t["done"].as_u64().unwrap_or(0) >= 1).then_some(()).ok_or(t)
    });
    a.kill();
    cli.ok(&["cancel", "r2"]);
    let mut con = cli.con();
    let waiting: Vec<String> = old
        .iter()
        .flat_map(|p| {
            let pattern = format!("{}node:*", p.replace('{', "\\{").replace('}', "\\}"));
            redis::cmd("KEYS").arg(pattern).query::<Vec<String>>(&mut con).unwrap()
        })
        .collect();
    assert!(!waiting.is_empty(), "no node list left to clean: the test would prove nothing");
    cli.ok(&["config", "--partitions", "1"]);
    // the dead node's departure seen (its rebalance done) before the clean
    let b = cli.executor("prc-b", &[]);
    support::eventually("the dead node's departure", Duration::from_secs(40), || {
        b.log().contains("departed=prc ").then_some(()).ok_or_else(|| b.log())
    });
    cli.ok(&["clean", "--older-than", "0s"]);
    let mut left: Vec<String> = Vec::new();
    for prefix in &old {
        let pattern = format!("{}*", prefix.replace('{', "\\{").replace('}', "\\}"));
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut con).unwrap();
        left.extend(keys);
    }
    assert!(left.is_empty(), "keys of retired partitions left: {left:?} (of {old:?})");
}
