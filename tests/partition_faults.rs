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
use shardctl_testkit::eventually;
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
