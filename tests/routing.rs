//! Routed tasks against real redis-server processes (issue 3, docs/design/routing.md): shards reach
//! the node their placement names, a task dispatched with no live
//! executor waits unplaced for the first one,
//! a SIGKILLed node loses no shard and only its shards move, a joining node takes over its share
//! of the waiting shards, the aggregation fires once, a dispatch cut short is completed by running
//! it again, a live node id cannot be taken twice, `ring simulate` shows the strategies' movement
//! and `status --json` lists the live nodes.
//!
//! Executors are real `shardctl executor` processes with small timings. Their handler is a child
//! process (`--exec`) that appends `<task> <node> <index> <key>` to a file in the test's directory,
//! so the test knows which node ran each shard; it prints the shard index, so that every shard
//! stores a result. The aggregator (`--aggregate-exec`) appends the task id to another file and
//! counts its input lines: the task's result is its shard count, and the file shows how many
//! times the aggregation ran. Waits are bounded by generous timeouts; no elapsed time is asserted.
//!
//! The numbers in parentheses in the tests' comments are those of the test plan: (1) placement,
//! (2) no live executor, (3) a node killed, (4) a node joining, (5) one aggregation, (6) a dispatch
//! cut short, (7) a node id taken twice, (8) `ring simulate`, (9) `status`.

use std::collections::{BTreeMap, BTreeSet};

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shardctl_common::model::TaskSpec;
use shardctl_common::ring::Strategy;
use shardctl_common::{scripts, Home};
use shardctl_testkit::TestRedis;

// the CLI tests' helpers: run the binary with a hang guard, no environment leaking in
#[allow(dead_code)]
mod support;

// the harness of this file
mod routing_support;

use routing_support::*;
use support::{eventually, shardctl, signal};

/// (1) Every shard of a routed task runs on the node its strategy names over the live members,
/// for each strategy, and with a keys file the owner is computed from the key of its line.
#[test]
fn routed_shards_run_on_the_node_their_placement_names() {
    let _s = serial();
    let mut env = RoutingEnv::start("reach", "0.05");
    for n in ["a", "b", "c"] {
        env.node(n);
    }
    env.wait_members(&["a", "b", "c"]);
    let nodes = ["a", "b", "c"];

    // 60 keys, with a blank line (skipped) and a CRLF line ending (trimmed)
    let keys: Vec<String> = (0..60).map(|i| format!("customer-{}", 1000 + i * 37)).collect();
    let mut text = String::new();
    for (i, k) in keys.iter().enumerate() {
        text.push_str(k);
        text.push_str(if i == 20 { "\r\n" } else { "\n" });
        if i == 10 {
            text.push('\n');
        }
    }
    let keys_file = env.dir.join("keys.txt");
    std::fs::write(&keys_file, text).unwrap();
    let keys_file = keys_file.to_str().unwrap().to_owned();
    // the keys place shards differently from their indexes: the test tells which one routing used
    for strategy in [Strategy::ConsistentHash, Strategy::HashMod] {
        let differ = (0..60u64)
            .filter(|&i| owner(strategy, &nodes, i, &keys[i as usize]) != owner(strategy, &nodes, i, &i.to_string()))
            .count();
        assert!(differ >= 10, "{strategy}: only {differ} keys place their shard elsewhere than its index");
    }

    let tasks: [(&str, Strategy, bool); 5] = [
        ("ch", Strategy::ConsistentHash, false),
        ("rr", Strategy::RoundRobin, false),
        ("hm", Strategy::HashMod, false),
        ("keys-ch", Strategy::ConsistentHash, true),
        ("keys-hm", Strategy::HashMod, true),
    ];
    for (id, strategy, with_keys) in tasks {
        let s = strategy.as_str();
        let out = if with_keys {
            env.dispatch(&["--strategy", s, "--keys-file", &keys_file, "--task-id", id])
        } else {
            env.dispatch(&["--strategy", s, "--shards", "60", "--task-id", id])
        };
        assert_eq!(out.stdout.trim(), id, "{out:?}");
        assert!(out.stderr.contains(&format!("60 of 60 shards placed on 3 executors ({s})")), "{out:?}");
    }
    for (id, strategy, with_keys) in tasks {
        let t = env.wait(id);
        env.check_completed(&t, 60);
        let runs = env.runs_of(id);
        for r in &runs {
            let key = if with_keys { keys[r.index as usize].clone() } else { r.index.to_string() };
            let want = owner(strategy, &nodes, r.index, &key);
            assert_eq!(r.node, want, "task {id} ({strategy}): shard {} (key {key}) ran on {}", r.index, r.node);
        }
        let per = per_node(&runs);
        assert_eq!(per.len(), 3, "task {id}: every node ran some shards: {per:?}");
        eprintln!("task {id} ({strategy}): runs per node {per:?}");
    }
    // the lists are drained, nothing is left to place
    for n in nodes {
        assert!(env.list(&format!("node:{n}:wait")).is_empty(), "node {n} still has refs");
    }
    let unrouted: Vec<String> =
        redis::cmd("ZRANGE").arg(env.key("unrouted")).arg(0).arg(-1).query(&mut env.con()).unwrap();
    assert!(unrouted.is_empty(), "{unrouted:?}");
}

/// With a keys file, the handler learns its shard's key (`SHARDCTL_SHARD_KEY`), the one the
/// shard was routed by.
// Regression: a keys-file shard once got its index as its key.
#[test]
fn a_keys_file_shard_gets_its_key() {
    let _s = serial();
    let mut env = RoutingEnv::start("key", "0");
    env.node("a");
    env.wait_members(&["a"]);
    let keys = ["eu-west/orders", "us-east/orders", "ap-south/orders", "eu-west/refunds"];
    let keys_file = env.dir.join("keys.txt");
    std::fs::write(&keys_file, keys.join("\n")).unwrap();
    env.dispatch(&["--strategy", "consistent-hash", "--keys-file", keys_file.to_str().unwrap(), "--task-id", "k"]);
    let t = env.wait("k");
    env.check_completed(&t, keys.len() as u64);
    for r in env.runs_of("k") {
        assert_eq!(r.key, keys[r.index as usize], "SHARDCTL_SHARD_KEY of shard {}", r.index);
    }
}

/// On a partitioned queue each share is placed by its shards' task indexes, or with a keys file
/// by their keys (each share keeps its keys at its own indexes): every shard runs on the node
/// it would run on in one partition, and its handler gets its key.
#[test]
fn over_partitions_shards_run_where_their_task_index_or_key_names() {
    let _s = serial();
    let mut env = RoutingEnv::start("parts", "0");
    for n in ["a", "b", "c"] {
        env.node(n);
    }
    env.wait_members(&["a", "b", "c"]);
    let nodes = ["a", "b", "c"];
    let out = env.run(&["config", "--partitions", "3"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let keys: Vec<String> = (0..60).map(|i| format!("customer-{}", 1000 + i * 37)).collect();
    let keys_file = env.dir.join("keys.txt");
    std::fs::write(&keys_file, keys.join("\n")).unwrap();
    let keys_file = keys_file.to_str().unwrap().to_owned();
    let tasks: [(&str, Strategy, bool); 4] = [
        ("p-ch", Strategy::ConsistentHash, false),
        ("p-rr", Strategy::RoundRobin, false),
        ("p-keys-ch", Strategy::ConsistentHash, true),
        ("p-keys-hm", Strategy::HashMod, true),
    ];
    for (id, strategy, with_keys) in tasks {
        let s = strategy.as_str();
        if with_keys {
            env.dispatch(&["--strategy", s, "--keys-file", &keys_file, "--task-id", id]);
        } else {
            env.dispatch(&["--strategy", s, "--shards", "60", "--task-id", id]);
        }
    }
    for (id, strategy, with_keys) in tasks {
        let t = env.wait(id);
        assert_eq!(
            (t["state"].as_str(), t["done"].as_u64(), t["partitions"].as_u64()),
            (Some("completed"), Some(60), Some(3)),
            "{t}"
        );
        let runs = env.runs_of(id);
        let indexes: std::collections::BTreeSet<u64> = runs.iter().map(|r| r.index).collect();
        assert_eq!(indexes.len(), 60, "task {id}: {runs:?}");
        for r in &runs {
            let key = if with_keys { keys[r.index as usize].clone() } else { r.index.to_string() };
            assert_eq!(r.key, key, "task {id}: the key of shard {}", r.index);
            let want = owner(strategy, &nodes, r.index, &key);
            assert_eq!(r.node, want, "task {id} ({strategy}): shard {} (key {key}) ran on {}", r.index, r.node);
        }
    }
    // the same id again with other keys: refused, and the task's keys are left as they were
    let other = env.dir.join("other.txt");
    std::fs::write(&other, (0..60).map(|i| format!("other-{i}\n")).collect::<String>()).unwrap();
    let out = env.run(&[
        "dispatch",
        "--kind",
        "mine",
        "--strategy",
        "consistent-hash",
        "--keys-file",
        other.to_str().unwrap(),
        "--task-id",
        "p-keys-ch",
    ]);
    assert_eq!(out.code(), 2, "{out:?}");
    let tags = env.run(&["config", "--json"]);
    let tags: Value = serde_json::from_str(tags.stdout.trim()).unwrap();
    let share1 = format!("{{{}}}:task:p-keys-ch:keys", tags["partition_tags"][0].as_str().unwrap());
    let first: Option<String> = redis::cmd("HGET").arg(&share1).arg(0).query(&mut env.con()).unwrap();
    assert_eq!(first.as_deref(), Some(keys[0].as_str()));
}

/// (2) No live executor at dispatch: the task waits unplaced (running, in `unrouted`), then the
/// first executor to join places it and runs it to the end.
#[test]
fn a_task_dispatched_with_no_live_executor_waits_for_the_first_one() {
    let _s = serial();
    let mut env = RoutingEnv::start("unplaced", "0.01");
    let out = env.dispatch(&["--strategy", "consistent-hash", "--shards", "20", "--task-id", "early"]);
    assert_eq!(out.stdout.trim(), "early");
    assert!(out.stderr.contains("no live executor"), "{out:?}");

    let out = env.run(&["status", "early", "--json"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let t: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(t["state"], json!("running"), "{t}");
    assert_eq!((t["done"].clone(), t["routed"].clone()), (json!(0), json!(0)), "{t}");
    let unrouted: Vec<String> =
        redis::cmd("ZRANGE").arg(env.key("unrouted")).arg(0).arg(-1).query(&mut env.con()).unwrap();
    assert_eq!(unrouted, ["early"]);
    let listed: Vec<String> = redis::cmd("SMEMBERS").arg(env.key("routed-nodes")).query(&mut env.con()).unwrap();
    assert!(listed.is_empty(), "nothing is placed without a member: {listed:?}");
    let q = env.run(&["status", "--json"]);
    let q: Value = serde_json::from_str(q.stdout.trim()).unwrap();
    assert_eq!(q["tasks"]["running"], json!(1), "{q}");
    assert_eq!(q["nodes"], json!([]), "{q}");
    eprintln!("queue status while unplaced: waiting {} active {}", q["waiting"], q["active"]);

    env.node("a");
    let t = env.wait("early");
    env.check_completed(&t, 20);
    assert_eq!(t["routed"], json!(20), "{t}");
    let runs = env.runs_of("early");
    assert!(runs.iter().all(|r| r.node == "a"), "{runs:?}");
    let unrouted: Vec<String> =
        redis::cmd("ZRANGE").arg(env.key("unrouted")).arg(0).arg(-1).query(&mut env.con()).unwrap();
    assert!(unrouted.is_empty(), "{unrouted:?}");
}

/// (3, 5) A node SIGKILLed mid-task loses no shard, and only its shards move: each goes to its
/// owner under the ring of the remaining nodes; no shard moves between two nodes that both
/// stayed. The aggregation still fires once.
#[test]
fn a_node_killed_mid_task_loses_no_shard_and_only_its_shards_move() {
    let _s = serial();
    let mut env = RoutingEnv::start("kill", "0.1");
    for n in ["a", "b", "c"] {
        env.node(n);
    }
    env.wait_members(&["a", "b", "c"]);
    let total = 90u64;
    let all3 = ["a", "b", "c"];
    let stay = ["a", "c"];
    let of_b = (0..total).filter(|&i| ring_owner(&all3, i) == "b").count();
    assert!(of_b >= 10, "the ring gives b only {of_b} of {total} shards");

    env.dispatch(&["--strategy", "consistent-hash", "--shards", &total.to_string(), "--task-id", "failover"]);
    // some progress by b, while its list still holds refs
    let left = eventually("b ran a few shards and still has some waiting", PATIENCE, || {
        let ran = env.runs_of("failover").iter().filter(|r| r.node == "b").count();
        let waiting = env.list("node:b:wait").len();
        if waiting == 0 {
            panic!("b ran all its shards before the kill: slow the handler down\n{}", env.tails());
        }
        if ran >= 3 && waiting >= 4 {
            Ok(waiting)
        } else {
            Err(format!("b ran {ran}, {waiting} waiting"))
        }
    });
    env.node_mut("b").kill();
    let done_at_kill = env.task_field("failover", "done").unwrap_or_default();
    eprintln!("b killed with about {left} shards on its list; {done_at_kill} done");

    let t = env.wait("failover");
    env.check_completed(&t, total);
    let runs = env.runs_of("failover");
    let mut moved = BTreeSet::new();
    for r in &runs {
        let before = ring_owner(&all3, r.index);
        if r.node == "b" {
            assert_eq!(before, "b", "shard {} ran on b, which did not own it", r.index);
            continue;
        }
        let after = ring_owner(&stay, r.index);
        assert_eq!(r.node, after, "shard {} (owner {before} before, {after} after b left) ran on {}", r.index, r.node);
        if before == "b" {
            moved.insert(r.index);
        }
    }
    assert!(!moved.is_empty(), "none of b's shards moved: {:?}", per_node(&runs));
    // every shard of b that b never started ran elsewhere, on its new owner (checked above)
    let ran_on_b: BTreeSet<u64> = runs.iter().filter(|r| r.node == "b").map(|r| r.index).collect();
    for i in (0..total).filter(|&i| ring_owner(&all3, i) == "b" && !ran_on_b.contains(&i)) {
        assert!(moved.contains(&i), "b's unrun shard {i} did not run on its new owner");
    }
    eprintln!("runs per node {:?}; {} of b's shards moved", per_node(&runs), moved.len());

    // b is gone from the membership and its list with it
    env.wait_members(&["a", "c"]);
    eventually("b's list is forgotten", PATIENCE, || {
        let listed: Vec<String> = redis::cmd("SMEMBERS").arg(env.key("routed-nodes")).query(&mut env.con()).unwrap();
        let left = env.list("node:b:wait");
        if left.is_empty() && !listed.contains(&"b".to_owned()) {
            Ok(())
        } else {
            Err(format!("routed-nodes {listed:?}, b's list {left:?}"))
        }
    });
    assert!(env.list("reroute").is_empty());
}

/// (4, 5) A node joining mid-task takes over its share of the waiting shards: once it has
/// joined every waiting ref is on the list of its owner under the new ring, the shards that ran
/// on the new node are all its own, it ran some, and no shard moved between the two old nodes.
#[test]
fn a_node_joining_mid_task_takes_over_its_share_of_waiting_shards() {
    let _s = serial();
    let mut env = RoutingEnv::start("join", "0.1");
    env.node("a");
    env.node("b");
    env.wait_members(&["a", "b"]);
    let total = 200u64;
    let old = ["a", "b"];
    let all3 = ["a", "b", "c"];
    env.dispatch(&["--strategy", "consistent-hash", "--shards", &total.to_string(), "--task-id", "grow"]);
    eventually("a and b made some progress", PATIENCE, || {
        let n = env.runs_of("grow").len();
        if n >= 10 {
            Ok(())
        } else {
            Err(format!("{n} runs"))
        }
    });
    env.node("c");
    env.wait_members(&["a", "b", "c"]);

    // once the rebalancer ran, every waiting ref sits on its new owner's list (one atomic read)
    let (sizes, ran_before) = eventually("the waiting refs are on their owners under {a, b, c}", PATIENCE, || {
        let (la, lb, lc): (Vec<String>, Vec<String>, Vec<String>) = redis::pipe()
            .atomic()
            .lrange(env.key("node:a:wait"), 0, -1)
            .lrange(env.key("node:b:wait"), 0, -1)
            .lrange(env.key("node:c:wait"), 0, -1)
            .query(&mut env.con())
            .unwrap();
        let wrong: Vec<String> = [("a", &la), ("b", &lb), ("c", &lc)]
            .iter()
            .flat_map(|(n, l)| {
                l.iter()
                    .filter(|r| {
                        let i: u64 = r.rsplit(':').next().unwrap().parse().unwrap();
                        ring_owner(&all3, i) != *n
                    })
                    .map(move |r| format!("{r} on {n}"))
            })
            .collect();
        if lc.is_empty() || !wrong.is_empty() {
            return Err(format!("c has {} refs; misplaced: {wrong:?}", lc.len()));
        }
        Ok(((la.len(), lb.len(), lc.len()), env.runs_of("grow").len()))
    });
    eprintln!("after c joined: lists a/b/c hold {sizes:?}, {ran_before} shards started before");

    let t = env.wait("grow");
    env.check_completed(&t, total);
    let runs = env.runs_of("grow");
    let on_c: Vec<&Run> = runs.iter().filter(|r| r.node == "c").collect();
    assert!(!on_c.is_empty(), "c ran nothing: {:?}", per_node(&runs));
    for r in &on_c {
        assert_eq!(ring_owner(&all3, r.index), "c", "shard {} ran on c, which does not own it", r.index);
    }
    for r in runs.iter().filter(|r| r.node != "c") {
        assert_eq!(ring_owner(&old, r.index), r.node, "shard {} moved between a and b", r.index);
    }
    let of_c = (0..total).filter(|&i| ring_owner(&all3, i) == "c").count();
    eprintln!("runs per node {:?}; c owns {of_c} shards of {total}", per_node(&runs));
}

/// (6, 5) A dispatch cut short (the task created, only its first chunk placed) is completed by
/// running the same command again: it says "resumed" and places exactly the rest. A different
/// spec under the same id is refused, and so is a re-run once the task is fully placed.
#[test]
fn a_dispatch_cut_short_is_completed_by_running_it_again() {
    let _s = serial();
    let mut env = RoutingEnv::start("resume", "0.02");
    let members = ["a", "b"];
    // a live membership without executors: no rebalancer runs, so only dispatches place shards
    // (a node's score is the time it is alive until)
    let fake_members = |env: &RoutingEnv| {
        let until = shardctl_common::time::now_ms() + 15_000;
        let _: () = redis::cmd("ZADD")
            .arg(env.key("nodes"))
            .arg(until)
            .arg("a")
            .arg(until)
            .arg("b")
            .query(&mut env.con())
            .unwrap();
    };
    fake_members(&env);

    // the crash, simulated: the task is created and the first chunk only is placed
    let (id, total, first) = ("resume-me", 60u64, 20u64);
    let (id0, total0) = ("resume-none", 10u64);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = shardctl_common::conn::open(&env.redis.url()).unwrap();
        let mut con = endpoint.manager().await.unwrap();
        let keys = Home::new("shardctl", &env.queue).unwrap();
        let spec = TaskSpec { strategy: Strategy::ConsistentHash, ..TaskSpec::new(id, "mine", total) };
        shardctl_coordinator::dispatch::create_task(&mut con, &keys, &spec).await.unwrap();
        let owners: Vec<String> = (0..first).map(|i| ring_owner(&members, i)).collect();
        let owners: Vec<&str> = owners.iter().map(String::as_str).collect();
        let routed = scripts::route(&mut con, &keys, id, 0, &owners).await.unwrap();
        assert_eq!(routed, first);
        // and one killed before it placed anything
        let spec = TaskSpec { strategy: Strategy::ConsistentHash, ..TaskSpec::new(id0, "mine", total0) };
        shardctl_coordinator::dispatch::create_task(&mut con, &keys, &spec).await.unwrap();
    });
    assert_eq!(env.task_field(id, "routed").as_deref(), Some("20"));
    let unrouted: Vec<String> =
        redis::cmd("ZRANGE").arg(env.key("unrouted")).arg(0).arg(-1).query(&mut env.con()).unwrap();
    let unrouted: BTreeSet<String> = unrouted.into_iter().collect();
    assert_eq!(unrouted, BTreeSet::from([id.to_owned(), id0.to_owned()]));

    // another spec under the same id is refused, and changes nothing
    for other in [
        vec!["--strategy", "consistent-hash", "--shards", "61"],
        vec!["--strategy", "round-robin", "--shards", "60"],
        vec!["--strategy", "consistent-hash", "--shards", "60", "--items", "120"],
        vec!["--strategy", "consistent-hash", "--shards", "60", "--payload", "{\"other\":1}"],
        vec!["--strategy", "consistent-hash", "--shards", "60", "--attempts", "7"],
    ] {
        let mut args = vec!["dispatch", "--kind", "mine", "--task-id", id];
        args.extend(other.iter().copied());
        let out = env.run(&args);
        assert_eq!(out.code(), 2, "{other:?}: {out:?}");
        assert!(out.stderr.contains("already exists"), "{other:?}: {out:?}");
        assert_eq!(env.task_field(id, "routed").as_deref(), Some("20"), "{other:?} placed shards");
    }
    let out =
        env.run(&["dispatch", "--kind", "other", "--task-id", id, "--strategy", "consistent-hash", "--shards", "60"]);
    assert_eq!(out.code(), 2, "another kind: {out:?}");

    // the same command again: resumed, places the rest
    let out = env.dispatch(&["--strategy", "consistent-hash", "--shards", "60", "--task-id", id]);
    assert_eq!(out.stdout.trim(), id, "{out:?}");
    assert!(out.stderr.contains("resumed"), "{out:?}");
    assert!(out.stderr.contains("60 of 60 shards placed on 2 executors"), "{out:?}");
    let out = env.dispatch(&["--strategy", "consistent-hash", "--shards", "10", "--task-id", id0]);
    assert!(out.stderr.contains("resumed") && out.stderr.contains("10 of 10 shards placed on 2 executors"), "{out:?}");
    assert_eq!(env.task_field(id, "routed").as_deref(), Some("60"));
    assert_eq!(env.task_field(id0, "routed").as_deref(), Some("10"));
    let unrouted: Vec<String> =
        redis::cmd("ZRANGE").arg(env.key("unrouted")).arg(0).arg(-1).query(&mut env.con()).unwrap();
    assert!(unrouted.is_empty(), "{unrouted:?}");

    // every shard placed once, on its owner
    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in members {
        for r in env.list(&format!("node:{n}:wait")) {
            placed.entry(r).or_default().push(n.to_owned());
        }
    }
    for (task, n) in [(id, total), (id0, total0)] {
        let inc = env.task_field(task, "seq").expect("the task's incarnation");
        for i in 0..n {
            let r = format!("{task}:{inc}:{i}");
            assert_eq!(placed.remove(&r), Some(vec![ring_owner(&members, i)]), "placement of {r}");
        }
    }
    assert!(placed.is_empty(), "refs of no shard placed: {placed:?}");

    // a fully placed task is not dispatched again
    for (task, n) in [(id, "60"), (id0, "10")] {
        let out =
            env.run(&["dispatch", "--kind", "mine", "--strategy", "consistent-hash", "--shards", n, "--task-id", task]);
        assert_eq!(out.code(), 2, "{out:?}");
        assert!(out.stderr.contains("already exists"), "{out:?}");
    }

    // the executors run both, each shard counted once
    fake_members(&env);
    env.node("a");
    env.node("b");
    for (task, n) in [(id, total), (id0, total0)] {
        let t = env.wait(task);
        env.check_completed(&t, n);
        let runs = env.runs_of(task);
        eprintln!("{task}: {} runs of {n} shards, per node {:?}", runs.len(), per_node(&runs));
    }
    let out =
        env.run(&["dispatch", "--kind", "mine", "--strategy", "consistent-hash", "--shards", "60", "--task-id", id]);
    assert_eq!(out.code(), 2, "a completed task is not dispatched again: {out:?}");
    assert!(out.stderr.contains("already exists"), "{out:?}");
}

/// (7) Two executors with the same node id: the second refuses to start while the first is alive;
/// once the first has stopped gracefully, or has been dead past the member timeout, a new one
/// with that id starts.
#[test]
fn a_live_node_id_cannot_be_taken_twice() {
    let _s = serial();
    let mut env = RoutingEnv::start("same-id", "0");
    // a member timeout far longer than the test: a dead holder's id frees only by takeover
    env.membership = ["200ms", "60s"];
    env.node("a");
    let first = env.nodes[0].pid();
    env.wait_members(&["a"]);
    let holder = |env: &RoutingEnv| -> Option<String> {
        redis::cmd("HGET").arg(env.key("node:a")).arg("pid").query(&mut env.con()).unwrap()
    };
    assert_eq!(holder(&env), Some(first.to_string()));

    let mut second = env.spawn_node("a");
    let st = second
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("a second executor with the live node id 'a' kept running:\n{}", second.log()));
    let log = second.log();
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains("node id 'a'") && log.contains("live executor"), "unclear refusal: {log}");
    assert!(log.contains(&format!("pid {first}")), "the refusal names the holder: {log}");
    assert!(env.node_mut("a").ended().is_none(), "the first executor stopped:\n{}", env.node_mut("a").log());
    assert_eq!(holder(&env), Some(first.to_string()), "the refused executor took the id over");
    env.wait_members(&["a"]);

    // a graceful stop leaves the membership: the id is free at once
    let st = env.node_mut("a").terminate();
    assert!(st.success(), "{st}");
    let members = env.members();
    assert!(members.is_empty(), "a gracefully stopped executor is still a member: {members:?}");
    env.node("a");
    let third = env.nodes.last().unwrap().pid();
    eventually("the new executor holds node id 'a'", PATIENCE, || {
        let h = holder(&env);
        if let Some(st) = env.node_mut("a").ended() {
            panic!("the new executor with a free id exited ({st}):\n{}", env.node_mut("a").log());
        }
        if h == Some(third.to_string()) {
            Ok(())
        } else {
            Err(format!("holder pid {h:?}"))
        }
    });
    env.dispatch(&["--strategy", "consistent-hash", "--shards", "4", "--task-id", "after"]);
    let t = env.wait("after");
    env.check_completed(&t, 4);
    assert!(env.runs_of("after").iter().all(|r| r.node == "a"));

    // a SIGKILLed holder on this host is provably dead (its pid is gone): a restart, as a
    // supervisor would do it at once, takes the id without waiting for the member timeout
    let dead = env.node_mut("a").pid();
    env.node_mut("a").kill();
    let mut taker = env.spawn_node("a");
    let taker_pid = taker.pid().to_string();
    eventually("the restarted executor takes the id of its dead predecessor", PATIENCE, || {
        if let Some(st) = taker.ended() {
            panic!("the restart after a crash was refused ({st}):\n{}", taker.log());
        }
        let h = holder(&env);
        if h.as_deref() == Some(taker_pid.as_str()) {
            Ok(())
        } else {
            Err(format!("holder pid {h:?}"))
        }
    });
    // the line is logged just after the id changed hands
    eventually("the restart to say it took the id over", PATIENCE, || {
        let log = taker.log();
        (log.contains("taken over from its dead predecessor") && log.contains(&format!("pid {dead}")))
            .then_some(())
            .ok_or(log)
    });
    env.nodes.push(taker);
    env.wait_members(&["a"]);
}

/// (8) `ring simulate` prints the three strategies: on 3 -> 4 nodes the ring moves about a quarter
/// of the keys, the static strategies more than half. Bad input is a usage error.
#[test]
fn ring_simulate_shows_what_each_strategy_moves() {
    let out = shardctl(&["ring", "simulate", "--nodes", "3", "--add", "1"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let moved: BTreeMap<String, f64> = out
        .stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.first()?;
            if !["consistent-hash", "round-robin", "hash-mod"].contains(&name) {
                return None;
            }
            let pct = f.last()?.strip_suffix('%')?.parse::<f64>().ok()?;
            Some((name.to_owned(), pct))
        })
        .collect();
    assert_eq!(moved.len(), 3, "three strategies: {out:?}");
    let ch = moved["consistent-hash"];
    assert!((15.0..=35.0).contains(&ch), "consistent-hash moved {ch}%: {out:?}");
    assert!(moved["round-robin"] > 50.0 && moved["hash-mod"] > 50.0, "{moved:?}");

    for bad in [
        &["ring", "simulate", "--nodes", "3", "--remove", "3"][..],
        &["ring", "simulate", "--nodes", "0"][..],
        &["ring", "simulate", "--nodes", "3", "--vnodes", "0"][..],
    ] {
        let out = shardctl(bad);
        assert_eq!(out.code(), 2, "{bad:?}: {out:?}");
        assert!(!out.stderr.trim().is_empty() && out.stdout.trim().is_empty(), "{bad:?}: {out:?}");
    }
    let out = shardctl(&["ring", "simulate", "--nodes", "3", "--remove", "3"]);
    assert!(out.stderr.contains("--remove"), "{out:?}");
}

/// (9) `status --json` lists the live nodes, each with its routed waiting and active shards; a
/// node that leaves is no longer listed and its waiting shards move to the others.
#[test]
fn status_lists_the_live_nodes_with_their_waiting_and_active_shards() {
    let _s = serial();
    let mut env = RoutingEnv::start("status", "0.3");
    env.node("a");
    env.node("b");
    env.wait_members(&["a", "b"]);
    let pids: BTreeMap<String, u64> = env.nodes.iter().map(|n| (n.id.clone(), u64::from(n.pid()))).collect();
    env.dispatch(&["--strategy", "consistent-hash", "--shards", "40", "--task-id", "watched"]);
    let status = |env: &RoutingEnv| -> Value {
        let out = env.run(&["status", "--json"]);
        assert_eq!(out.code(), 0, "{out:?}");
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("status --json ({e}): {out:?}"))
    };
    let seen = eventually("status shows both nodes with shards waiting and active", PATIENCE, || {
        let v = status(&env);
        let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        let names: BTreeSet<&str> = nodes.iter().filter_map(|n| n["node"].as_str()).collect();
        assert_eq!(names, BTreeSet::from(["a", "b"]), "{v}");
        let (mut waiting, mut active) = (0, 0);
        for n in &nodes {
            let name = n["node"].as_str().unwrap();
            assert_eq!(n["pid"].as_u64(), Some(pids[name]), "{n}");
            let (w, a) = (n["waiting"].as_u64(), n["active"].as_u64());
            let (Some(w), Some(a)) = (w, a) else { panic!("waiting and active must be numbers: {n}") };
            assert!(a <= 2, "more active than the concurrency: {n}");
            waiting += w;
            active += a;
        }
        assert!(waiting + active <= 40, "{v}");
        if waiting > 0 && active > 0 && nodes.iter().all(|n| n["waiting"].as_u64() > Some(0)) {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    });
    eprintln!("status: {}", seen["nodes"]);

    // b leaves gracefully: it is no longer listed, and its waiting shards move to a
    let st = env.node_mut("b").terminate();
    assert!(st.success(), "{st}");
    eventually("status lists a only, with b's shards", PATIENCE, || {
        let v = status(&env);
        let names: Vec<&str> = v["nodes"].as_array().unwrap().iter().filter_map(|n| n["node"].as_str()).collect();
        if names == ["a"] && env.list("node:b:wait").is_empty() {
            Ok(())
        } else {
            Err(v.to_string())
        }
    });
    let t = env.wait("watched");
    env.check_completed(&t, 40);
    let v = status(&env);
    let a = &v["nodes"][0];
    assert_eq!((a["waiting"].as_u64(), a["active"].as_u64()), (Some(0), Some(0)), "{v}");
}

/// A shard of a routed task that fails an attempt is retried on its owner: data locality holds
/// for retries as it does for recovered and released shards (they go to `reroute`).
// Regression: retries of routed shards once ran wherever capacity was; they go back to their node.
#[test]
fn a_retried_routed_shard_runs_on_its_owner_again() {
    let _s = serial();
    let mut env = RoutingEnv::start("retry", "0.02");
    for n in ["a", "b", "c"] {
        env.node(n);
    }
    env.wait_members(&["a", "b", "c"]);
    let nodes = ["a", "b", "c"];
    let total = 30u64;
    // kind `flaky`: the handler fails every shard's first attempt
    let args = ["--strategy", "consistent-hash", "--shards", "30", "--task-id", "retried"];
    env.dispatch_kind("flaky", &[&args[..], &["--attempts", "3", "--backoff", "fixed:100ms"]].concat());
    let t = env.wait("retried");
    env.check_completed(&t, total);
    let runs = env.runs_of("retried");
    for i in 0..total {
        let attempts: BTreeSet<u64> = runs.iter().filter(|r| r.index == i).map(|r| r.attempt).collect();
        assert!(attempts.contains(&1) && attempts.contains(&2), "shard {i} attempts {attempts:?}");
    }
    let elsewhere: Vec<String> = runs
        .iter()
        .filter(|r| r.node != ring_owner(&nodes, r.index))
        .map(|r| {
            format!("shard {} attempt {} on {} (owner {})", r.index, r.attempt, r.node, ring_owner(&nodes, r.index))
        })
        .collect();
    assert!(elsewhere.is_empty(), "{} of {} runs off their owner: {elsewhere:?}", elsewhere.len(), runs.len());
}

/// Routed work that becomes claimable between two membership heartbeats (a delayed task that
/// starts, failed shards retried) is placed at once: the script leaves a `route` marker and the
/// idle executor that pops it rebalances. The heartbeat here is 30 s and each wait gives up
/// after 15 s, so only that wake-up lets them complete.
#[test]
fn routed_work_that_becomes_claimable_is_placed_without_waiting_for_a_heartbeat() {
    let _s = serial();
    let mut env = RoutingEnv::start("route-wake", "0.01");
    env.membership = ["30s", "90s"];
    for n in ["a", "b"] {
        env.node(n);
    }
    env.wait_members(&["a", "b"]);
    // a heartbeat passes before the first claim: let the startup rebalances settle
    std::thread::sleep(Duration::from_millis(300));

    env.dispatch(&["--strategy", "consistent-hash", "--shards", "12", "--task-id", "later", "--delay", "1s"]);
    assert_eq!(env.task_field("later", "state").as_deref(), Some("delayed"));
    let out = env.run(&["wait", "later", "--timeout", "15s", "--json"]);
    assert_eq!(out.code(), 0, "a delayed routed task is placed when it starts: {out:?}\n{}", env.tails());

    // every first attempt fails, and one attempt is all a shard has: the task fails, then is retried
    env.dispatch_kind(
        "flaky",
        &["--strategy", "round-robin", "--shards", "8", "--task-id", "again", "--attempts", "1"],
    );
    let out = env.run(&["wait", "again", "--timeout", "15s", "--json"]);
    assert_eq!(out.code(), 3, "{out:?}");
    // another process holds the rebalance lock when the wake-up comes: it is tried again shortly
    let _: () = redis::cmd("SET")
        .arg(env.key("rebalance-lock"))
        .arg("someone-else")
        .arg("PX")
        .arg(600)
        .query(&mut env.con())
        .unwrap();
    let out = env.run(&["retry", "again"]);
    assert_eq!(out.code(), 0, "{out:?}");
    let out = env.run(&["wait", "again", "--timeout", "15s", "--json"]);
    assert_eq!(out.code(), 0, "retried routed shards are placed at once: {out:?}\n{}", env.tails());
    let t: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((t["done"].clone(), t["failed"].clone()), (json!(8), json!(0)), "{t}");
}

/// An executor frozen (SIGSTOP) past the member timeout has lost its node id: a new executor may
/// take it, and when the frozen one wakes it stops instead of counting as that node too.
#[test]
fn a_frozen_node_loses_its_id_and_stops_when_it_wakes() {
    let _s = serial();
    let mut env = RoutingEnv::start("frozen", "0");
    env.node("a");
    env.wait_members(&["a"]);
    let old = env.nodes[0].pid();
    signal(old, "STOP");
    let holder = |env: &RoutingEnv| -> Option<String> {
        redis::cmd("HGET").arg(env.key("node:a")).arg("pid").query(&mut env.con()).unwrap()
    };
    let taker = eventually("a new executor takes the id of a frozen one", PATIENCE, || {
        let mut n = env.spawn_node("a");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if n.ended().is_some() {
                return Err(format!("refused: {}", n.log().lines().last().unwrap_or("")));
            }
            if holder(&env) == Some(n.pid().to_string()) {
                return Ok(n);
            }
            if Instant::now() > deadline {
                panic!("executor neither refused nor joined:\n{}", n.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let new = taker.pid();
    env.nodes.push(taker);
    signal(old, "CONT");
    let st = env.nodes[0]
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the woken executor kept running as node a:\n{}", env.nodes[0].log()));
    let log = env.nodes[0].log();
    assert!(!st.success(), "the woken executor must report that it lost its id: {st}\n{log}");
    assert!(log.contains("node id 'a'"), "{log}");
    assert!(env.nodes[1].ended().is_none(), "the new holder stopped:\n{}", env.nodes[1].log());
    assert_eq!(holder(&env), Some(new.to_string()), "the woken executor took the id back or removed it");
    env.wait_members(&["a"]);
    env.dispatch(&["--strategy", "consistent-hash", "--shards", "4", "--task-id", "after-freeze"]);
    let t = env.wait("after-freeze");
    env.check_completed(&t, 4);
}

/// Liveness is judged by each executor's own `--member-timeout`, not by the reader's: a node that
/// beat 30 s ago is live under a 60 s timeout and gone under a 20 s one, for `dispatch`,
/// `status`, coordinators and rebalancers alike.
#[test]
fn each_node_is_live_for_its_own_member_timeout() {
    use shardctl_coordinator::membership;
    let redis = TestRedis::start();
    let keys = Home::new("shardctl", "own-timeout").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let endpoint = shardctl_common::conn::open(&redis.url()).unwrap();
        let mut con = endpoint.manager().await.unwrap();
        // both beat 30 s ago by the server's clock (the one join.lua scores with)
        let beat = shardctl_common::time::server_now_ms(&mut con, &keys).await.unwrap() - 30_000;
        for (node, timeout) in [("patient", 60_000u64), ("hasty", 20_000)] {
            let fields = [("host", "h".to_owned())];
            let joined = scripts::join(&mut con, &keys, node, node, timeout, None, &fields).await.unwrap();
            assert!(joined.is_ok());
            let _: () =
                redis::cmd("ZADD").arg(keys.nodes()).arg(beat + timeout).arg(node).query_async(&mut con).await.unwrap();
        }
        assert_eq!(membership::live(&mut con, &keys).await.unwrap(), ["patient"]);
        let nodes = shardctl_coordinator::progress::nodes(&mut con, &keys).await.unwrap();
        assert_eq!(nodes.len(), 1);
        assert!((29_000..60_000).contains(&nodes[0].heartbeat_age_ms), "{nodes:?}");
        // a rebalance reaps the hasty one only
        let r = shardctl_coordinator::rebalance::rebalance(&mut con, &keys).await.unwrap().unwrap();
        assert_eq!((r.departed, r.live), (vec!["hasty".to_owned()], vec!["patient".to_owned()]));
        // and a second process under the patient node's id is refused while it lives
        let again = scripts::join(&mut con, &keys, "patient", "other", 60_000, None, &[]).await.unwrap();
        let holder = again.unwrap_err();
        assert!((29_000..31_000).contains(&holder.age_ms), "{}", holder.age_ms);
    });
}
