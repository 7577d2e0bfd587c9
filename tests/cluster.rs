//! shardctl on a real Redis Cluster (issue 7): three masters started by the test
//! (`shardctl_testkit::TestCluster`), real `shardctl executor` processes, exact results. Queues
//! whose hash tags land on different masters run at the same time; every key a run leaves is read
//! back from the nodes and must sit in its queue's one slot, on that slot's master; an executor
//! SIGKILLed mid-run loses nothing and nothing is counted twice; a queue's slot moved to another
//! master while its task runs (ASK, then MOVED), or its master killed so that a replica takes
//! over (failover), changes nothing in the result.
//!
//! Nothing here asserts an elapsed time: waits poll for a state under a hang guard.

#[allow(dead_code)] // shared with tests/cli.rs, which uses all of it
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use shardctl_testkit::TestCluster;
use support::{shardctl, Cli, CHAOS_EXECUTOR_ARGS};

/// How long a state may take to show before the test calls it hung (a guard, not a timing).
const GUARD: Duration = Duration::from_secs(60);

/// π(10⁶): 100 shards of 10,000 items.
const PRIMES_BELOW_1E6: u64 = 78_498;
/// π(4·10⁷): enough work (a few seconds in a debug build) that a crash finds shards in flight.
const PRIMES_BELOW_4E7: u64 = 2_433_654;

/// Short timings, as the crash tests use, and a stall count that repeated crashes never reach.
/// [`CHAOS_EXECUTOR_ARGS`] and a quick membership.
const MEMBER_ARGS: &[&str] = &["--member-heartbeat", "200ms", "--member-timeout", "1s"];

/// The hash tag of queue `q` under the default prefix, as `common::keys` builds it.
fn tag(q: &str) -> String {
    format!("{{shardctl:{q}}}")
}

/// One queue name per master: `<stem>-<n>` for the first n whose slot that master owns.
fn queues_on_every_master(cluster: &TestCluster, stem: &str) -> BTreeMap<u16, String> {
    let mut by_master = BTreeMap::new();
    for n in 0..1000 {
        let q = format!("{stem}-{n}");
        by_master.entry(cluster.owner(cluster.keyslot(&tag(&q)))).or_insert(q);
        if by_master.len() == cluster.ports().len() {
            return by_master;
        }
    }
    panic!("no queue names spread over every master");
}

/// Starts `shardctl executor --node-id <node>` with [`CHAOS_EXECUTOR_ARGS`] and [`MEMBER_ARGS`].
fn executor(cli: &Cli<&TestCluster>, node: &str) -> support::Process {
    cli.background(node, &[&["executor", "--node-id", node][..], CHAOS_EXECUTOR_ARGS, MEMBER_ARGS].concat())
}

fn task_json(cli: &Cli<&TestCluster>, id: &str) -> Value {
    cli.json(&["status", id, "--json"], 0)
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    shardctl_testkit::eventually(what, GUARD, || ok().then_some(()).ok_or("not yet"))
}

/// Every key of queue `q` found on any node: (node port, key).
fn keys_of(cluster: &TestCluster, q: &str) -> Vec<(u16, String)> {
    let t = tag(q);
    let mut out = Vec::new();
    for port in cluster.ports() {
        out.extend(cluster.keys_on(port).into_iter().filter(|k| k.starts_with(&t)).map(|k| (port, k)));
    }
    out
}

/// Asserts that every key of `q` is in the queue's slot, on the master that owns it; returns
/// that master.
fn assert_one_slot(cluster: &TestCluster, q: &str) -> u16 {
    let slot = cluster.keyslot(&tag(q));
    let owner = cluster.owner(slot);
    let keys = keys_of(cluster, q);
    assert!(keys.len() >= 5, "queue {q} left only {keys:?}");
    for (port, k) in &keys {
        assert_eq!(cluster.keyslot(k), slot, "key {k} of queue {q} is outside the queue's slot {slot}");
        assert_eq!(*port, owner, "key {k} of queue {q} is on {port}, its slot's master is {owner}");
    }
    owner
}

#[test]
fn queues_on_different_masters_run_at_once_and_keep_their_keys_in_one_slot() {
    let cluster = TestCluster::start(3);
    let queues = queues_on_every_master(&cluster, "spread");
    let clis: Vec<Cli<&TestCluster>> = queues.values().map(|q| Cli::on(&cluster, &cluster.url(), q)).collect();
    // one executor per queue, and a second on the first queue for the routed task's ring
    let mut executors: Vec<_> = clis.iter().map(|c| executor(c, &format!("{}-a", c.queue))).collect();
    executors.push(executor(&clis[0], "routed-b"));

    // every queue gets a pull task at once; the first also a consistent-hash one
    let runs: Vec<(usize, Value)> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, cli) in clis.iter().enumerate() {
            handles.push(s.spawn(move || {
                let args = ["dispatch", "--shards", "100", "--items", "1000000", "--wait", "--json"];
                (i, cli.json(&args, 0))
            }));
        }
        let routed = s.spawn(|| {
            let args = ["dispatch", "--shards", "30", "--items", "1000000", "--strategy", "consistent-hash"];
            (0, clis[0].json(&[&args[..], &["--wait", "--json"]].concat(), 0))
        });
        handles.push(routed);
        handles.into_iter().map(|h| h.join().expect("dispatch thread")).collect()
    });
    for (i, w) in &runs {
        let total = w["total"].as_u64().unwrap();
        assert_eq!(w["state"], "completed", "queue {}: {w}", clis[*i].queue);
        assert_eq!((w["done"].as_u64(), w["failed"].as_u64()), (Some(total), Some(0)), "{w}");
        assert_eq!(w["result"]["primes"], PRIMES_BELOW_1E6, "queue {}: {w}", clis[*i].queue);
    }

    // status (both forms), watch (XREAD BLOCK) and the event log work per queue
    for cli in &clis {
        let q = cli.json(&["status", "--json"], 0);
        assert_eq!(q["queue"], cli.queue.as_str(), "{q}");
        assert!(!q["nodes"].as_array().unwrap().is_empty(), "no live executor in status: {q}");
        let id = runs.iter().find(|(i, _)| clis[*i].queue == cli.queue).unwrap().1["task_id"].as_str().unwrap();
        assert_eq!(task_json(cli, id)["state"], "completed");
        let out = cli.run(&["watch", "--from-start", "--count", "2", "--json"]);
        assert_eq!(out.code(), 0, "{out:?}");
        assert!(out.stdout.contains("task_dispatched"), "{out:?}");
    }
    // the other commands an operator runs, on the first queue's master
    let cli = &clis[0];
    let mut coordinator =
        cli.background("coord", &["coordinator", "--metrics-addr", "127.0.0.1:0", "--refresh", "200ms"]);
    cli.ok(&["schedule", "add", "tick", "--cron", "* * * * * *", "--shards", "1", "--kind", "noop"]);
    for args in [&["pause"][..], &["resume"], &["config", "--events-maxlen", "500"], &["lock", "nightly", "--", "true"]]
    {
        cli.ok(args);
    }
    cli.ok(&["limit", "--max", "100000", "--per", "1s"]);
    let sleepy = cli.ok(&["dispatch", "--shards", "2", "--kind", "sleep", "--payload", r#"{"ms":20000}"#]);
    cli.ok(&["cancel", sleepy.trim()]);
    assert_eq!(cli.run(&["wait", sleepy.trim(), "--json"]).code(), 4);
    wait_until("a schedule fired", || coordinator.log().contains("schedule fired"));
    cli.ok(&["schedule", "remove", "tick"]);
    cli.ok(&["limit", "--off"]);
    assert!(coordinator.terminate().success(), "coordinator: {}", coordinator.log());
    assert!(!coordinator.log().contains("ERROR"), "coordinator: {}", coordinator.log());

    // scripts are called by SHA: after SCRIPT FLUSH on every node, NOSCRIPT makes the client
    // load them (SCRIPT LOAD goes to every master) and retry on the key's node
    for port in cluster.ports() {
        let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut cluster.node_con(port)).expect("SCRIPT FLUSH");
    }
    for cli in &clis {
        let w = cli.json(&["dispatch", "--shards", "4", "--items", "1000", "--wait", "--json"], 0);
        assert_eq!(w["result"]["primes"], 168, "after SCRIPT FLUSH: {w}");
    }
    for e in &mut executors {
        e.terminate();
    }

    // every key left by the runs (tasks, results, index, events, nodes, markers, …) sits in its
    // queue's slot on that slot's master, and the three queues live on three masters
    let masters: BTreeSet<u16> = queues.values().map(|q| assert_one_slot(&cluster, q)).collect();
    assert_eq!(masters.len(), 3, "queues {queues:?} did not spread over the masters");
}

#[test]
fn an_executor_killed_mid_run_on_a_cluster_loses_nothing() {
    let cluster = TestCluster::start(3);
    let cli = Cli::on(&cluster, &cluster.url(), "crash");
    let mut a = executor(&cli, "crash-a");
    let mut b = executor(&cli, "crash-b");
    let id = cli.ok(&["dispatch", "--shards", "400", "--items", "40000000"]).trim().to_owned();

    wait_until("a tenth of the shards", || task_json(&cli, &id)["done"].as_u64().unwrap() >= 40);
    a.kill();
    let at_kill = task_json(&cli, &id);
    assert!(at_kill["done"].as_u64().unwrap() < 400, "the task ended before the crash: {at_kill}");
    let _c = executor(&cli, "crash-c");

    let w = cli.json(&["wait", &id, "--json", "--timeout", "60s"], 0);
    assert_eq!(w["state"], "completed", "{w}");
    assert_eq!((w["done"].as_u64(), w["failed"].as_u64()), (Some(400), Some(0)), "counted once: {w}");
    assert_eq!(w["result"]["primes"], PRIMES_BELOW_4E7, "{w}; log b:\n{}", b.log());
    b.terminate();
    assert_one_slot(&cluster, "crash");
}

#[test]
fn a_queue_moved_to_another_master_mid_run_finishes_exactly() {
    let cluster = TestCluster::start(3);
    let cli = Cli::on(&cluster, &cluster.url(), "moved");
    let slot = cluster.keyslot(&tag("moved"));
    let from = cluster.owner(slot);
    let to = *cluster.ports().iter().find(|&&p| p != from).unwrap();
    let mut a = executor(&cli, "moved-a");
    let id = cli.ok(&["dispatch", "--shards", "200", "--items", "40000000"]).trim().to_owned();

    wait_until("the first shards", || task_json(&cli, &id)["done"].as_u64().unwrap() >= 10);
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.owner(slot), to);
    let after = task_json(&cli, &id);
    assert!(after["done"].as_u64().unwrap() < 200, "the task ended before the move did: {after}");

    let w = cli.json(&["wait", &id, "--json", "--timeout", "60s"], 0);
    assert_eq!((w["done"].as_u64(), w["failed"].as_u64()), (Some(200), Some(0)), "{w}; log:\n{}", a.log());
    assert_eq!(w["result"]["primes"], PRIMES_BELOW_4E7, "{w}");
    a.terminate();
    assert_eq!(assert_one_slot(&cluster, "moved"), to);
}

#[test]
fn a_queue_whose_master_dies_finishes_exactly_on_the_promoted_replica() {
    let promoted = failover_round("failover", 1);
    assert_eq!(promoted.0, promoted.1, "{promoted:?}");
}

/// A queue over 3 partitions (docs/design/partitions.md): the master of a partition
/// (not the home's) dies mid-run and its replica is promoted; the writes it had not replicated
/// are lost, their shards run again, and the task still ends exactly, counted once.
#[test]
fn a_partition_whose_master_dies_finishes_exactly_on_the_promoted_replica() {
    failover_round("pfail", 3);
}

/// One master (with a replica) dies with shards in flight and its replica is promoted
/// (cluster-node-timeout 2 s): the queue's own master, or with `partitions` > 1 the master of a
/// partition other than the home's. The executors carry on through the new master: writes the
/// replica had not received are lost, so their shards run again, but every shard is counted once
/// and the result is exact. Returns the promoted master and the queue's slot owner at the end.
fn failover_round(queue: &str, partitions: u32) -> (u16, u16) {
    let mut cluster = TestCluster::start_with_replicas(3, 1);
    let cli = Cli::on(&cluster, &cluster.url(), queue);
    let home = cluster.keyslot(&tag(queue));
    let slot = if partitions > 1 {
        let cfg = cli.json(&["config", "--partitions", &partitions.to_string(), "--json"], 0);
        cfg["partition_tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| cluster.keyslot(&format!("{{{}}}", t.as_str().unwrap())))
            .find(|&s| cluster.owner(s) != cluster.owner(home))
            .expect("a partition on another master than the home's")
    } else {
        home
    };
    let mut a = executor(&cli, &format!("{queue}-a"));
    let mut b = executor(&cli, &format!("{queue}-b"));
    let id = cli.ok(&["dispatch", "--shards", "400", "--items", "40000000"]).trim().to_owned();
    wait_until("the first shards", || task_json(&cli, &id)["done"].as_u64().unwrap() >= 10);
    let before = task_json(&cli, &id);
    assert!(before["done"].as_u64().unwrap() < 400, "the task ended before the failover: {before}");
    drop(cli);

    let dead = cluster.kill_owner(slot);
    let promoted = cluster.wait_for_failover(slot);
    assert_ne!(promoted, dead);

    let cli = Cli::on(&cluster, &cluster.url(), queue);
    let w = cli.json(&["wait", &id, "--json", "--timeout", "90s"], 0);
    assert_eq!(w["state"], "completed", "{w}; log a:\n{}", a.log());
    assert_eq!((w["done"].as_u64(), w["failed"].as_u64()), (Some(400), Some(0)), "counted once: {w}");
    assert_eq!(w["result"]["primes"], PRIMES_BELOW_4E7, "{w}");
    a.terminate();
    b.terminate();
    (promoted, assert_one_slot(&cluster, queue))
}

#[test]
fn bad_cluster_urls_are_clear_errors() {
    for (url, code, needle) in [
        ("redis+cluster://", 2, "no seed node"),
        ("redis+cluster://app:hunter2@127.0.0.1", 2, "is not host:port"),
        ("redis+cluster://127.0.0.1:1", 1, "cannot connect to redis cluster"),
    ] {
        let out = shardctl(&["--redis", url, "status"]);
        assert_eq!(out.code(), code, "{url}: {out:?}");
        assert!(out.stderr.contains(needle), "{url}: {out:?}");
        assert!(!out.stderr.contains("hunter2"), "password shown: {out:?}");
    }
    // Redlock needs independent servers
    let out = shardctl(&["lock", "n", "--redlock", "redis+cluster://a:1,redis://b:2,redis://c:3", "--", "true"]);
    assert_eq!(out.code(), 125, "lock's own bad input (cli/exit.rs, exit::FAILED): {out:?}");
}

/// A replica that stops answering (frozen, no failover) and serves none of the queue's keys
/// does not stall the queue: a script the cluster's nodes have not cached is run where it runs
/// (`EVAL` on the slot's master), never loaded with `SCRIPT LOAD`, which the cluster client sends
/// to every node, replicas included, and waits for all of them (measured by hand with a frozen
/// replica still in good standing: the next task took 37 to 45 s, every script's first call
/// waiting out the 10 s response timeout; 0.01 s now). The home master's `MONITOR` shows what
/// the queue sent it after the scripts were flushed.
#[test]
fn a_frozen_replica_of_another_master_does_not_stall_the_queue() {
    let cluster = TestCluster::start_with_replicas(3, 1);
    let queue = "frozen";
    let home = cluster.owner(cluster.keyslot(&tag(queue)));
    let masters = cluster.ports();
    let other = masters.iter().copied().find(|&p| p != home && !cluster.replicas_of(p).is_empty()).unwrap();
    let cli = Cli::on(&cluster, &cluster.url(), queue);
    let ex = executor(&cli, "frozen-a");
    let w = cli.json(&["dispatch", "--shards", "40", "--kind", "noop", "--wait", "--json"], 0);
    assert_eq!(w["done"], 40, "{w}");
    let frozen = cluster.cut_off_replicas(other);
    assert_eq!(frozen.len(), 1, "{frozen:?}");
    for &p in &masters {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut cluster.node_con(p)).unwrap();
    }
    let seen = std::env::temp_dir().join(format!("shardctl-frozen-monitor-{}", std::process::id()));
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &home.to_string(), "monitor"])
        .stdout(std::fs::File::create(&seen).unwrap())
        .spawn()
        .expect("redis-cli runs");
    wait_until("the monitor", || std::fs::read_to_string(&seen).is_ok_and(|s| s.contains("OK")));
    let w = cli.json(&["dispatch", "--shards", "40", "--kind", "noop", "--wait", "--timeout", "8s", "--json"], 0);
    assert_eq!((w["done"].as_u64(), w["failed"].as_u64()), (Some(40), Some(0)), "{w}\n{}", ex.log());
    let _ = monitor.kill();
    let _ = monitor.wait();
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert!(!seen.contains(r#""SCRIPT" "LOAD""#), "a script was loaded with SCRIPT LOAD:\n{seen}");
    assert!(seen.contains(r#""EVAL""#), "no script ran by EVAL after the flush:\n{seen}");
    cluster.thaw(frozen[0]);
}
