//! Flow control through the binary: priorities order claims, pause stops claims while running
//! shards finish, resume restarts them at once.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_testkit::TestRedis;
use support::{Cli, Out, Process};

fn cli(url: &str, queue: &str, args: &[&str]) -> Out {
    Cli::on((), url, queue).run(args)
}

fn ok(url: &str, queue: &str, args: &[&str]) -> String {
    Cli::on((), url, queue).ok(args)
}

fn executor(url: &str, queue: &str, extra: &[&str]) -> Process {
    let mut args =
        [&["executor", "--node-id", "flow", "--block-timeout", "200ms", "--log", "error"][..], extra].concat();
    if extra.contains(&"--exec") {
        // a test not about kinds lets its --exec serve every kind
        args.extend_from_slice(&["--kinds", "*"]);
    }
    Cli::on((), url, queue).background("flow", &args)
}

fn done(url: &str, queue: &str, task: &str) -> (u64, String) {
    let v: serde_json::Value = serde_json::from_str(&ok(url, queue, &["status", task, "--json"])).unwrap();
    (v["done"].as_u64().unwrap(), v["state"].as_str().unwrap().to_owned())
}

/// Priorities are strict; equal priorities share the executors (docs/design/fairness.md), the
/// first dispatched starting first.
#[test]
fn higher_priority_runs_first_and_equal_priorities_share() {
    let r = TestRedis::start();
    let url = r.url();
    let dir = std::env::temp_dir().join(format!("shardctl-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("order.log");
    for (id, p) in [("low-a", "0"), ("high", "5"), ("low-b", "0"), ("negative", "-3")] {
        ok(&url, "prio", &["dispatch", "--kind", "mine", "--shards", "3", "--task-id", id, "--priority", p]);
    }
    let cmd = format!("sh -c 'echo $SHARDCTL_TASK_ID >> {}'", log.display());
    let _e = executor(&url, "prio", &["--concurrency", "1", "--exec", &cmd]);
    for id in ["low-a", "high", "low-b", "negative"] {
        ok(&url, "prio", &["wait", id, "--timeout", "30s"]);
    }
    let order: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(order.len(), 12, "{order:?}");
    assert!(order[..3].iter().all(|t| t == "high"), "claim order: {order:?}");
    assert!(order[9..].iter().all(|t| t == "negative"), "claim order: {order:?}");
    assert_eq!(order[3], "low-a", "the first dispatched of equal priorities starts first: {order:?}");
    assert!(order[3..9].iter().all(|t| t == "low-a" || t == "low-b"), "claim order: {order:?}");
    let bad = cli(&url, "prio", &["dispatch", "--shards", "1", "--priority", "2000000"]);
    assert_eq!(bad.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pause_stops_claims_running_shards_finish_and_resume_restarts_at_once() {
    let r = TestRedis::start();
    let url = r.url();
    ok(&url, "pz", &["dispatch", "--kind", "sleep", "--payload", r#"{"ms":300}"#, "--shards", "40", "--task-id", "t"]);
    let _e = executor(&url, "pz", &["--concurrency", "4"]);
    shardctl_testkit::eventually("progress", Duration::from_secs(20), || {
        let (done, _) = done(&url, "pz", "t");
        (done >= 4).then_some(()).ok_or(format!("{done} done"))
    });
    assert!(ok(&url, "pz", &["pause"]).contains("paused"));
    // what was running finishes; nothing new starts
    std::thread::sleep(Duration::from_millis(1200));
    let (after_pause, _) = done(&url, "pz", "t");
    let q: serde_json::Value = serde_json::from_str(&ok(&url, "pz", &["status", "--json"])).unwrap();
    assert_eq!(q["paused"], true);
    assert_eq!(q["active"], 0, "running shards finish while paused: {q}");
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(done(&url, "pz", "t").0, after_pause, "nothing is claimed while paused");
    assert!(after_pause < 40);
    assert!(ok(&url, "pz", &["resume"]).contains("resumed"));
    ok(&url, "pz", &["wait", "t", "--timeout", "60s"]);
    assert_eq!(done(&url, "pz", "t"), (40, "completed".to_owned()));
}

#[test]
fn an_attempt_past_the_shard_timeout_fails_with_timed_out() {
    let r = TestRedis::start();
    let url = r.url();
    let args = ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":60000}"#, "--shards", "3", "--task-id", "slow"];
    ok(&url, "to", &[&args[..], &["--shard-timeout", "200ms", "--attempts", "2", "--backoff", "fixed:10ms"]].concat());
    let _e = executor(&url, "to", &["--concurrency", "4"]);
    let out = cli(&url, "to", &["wait", "slow", "--timeout", "30s"]);
    assert_eq!(out.status.code(), Some(3), "every shard timed out twice: {out:?}");
    let failed = ok(&url, "to", &["status", "slow", "--failed"]);
    assert_eq!(failed.lines().filter(|l| l.contains("timed out after 200ms")).count(), 3, "{failed}");
    let bad = cli(&url, "to", &["dispatch", "--shards", "1", "--shard-timeout", "0s"]);
    assert_eq!(bad.status.code(), Some(2));
}
