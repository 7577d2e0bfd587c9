//! End-to-end tests of the `shardctl` binary: the CLI contract of issue 2 (item 6) and its
//! bad-input rules (item 2), driven through real processes against a private redis-server per
//! test. Executors are real `shardctl executor` processes, stopped with SIGTERM or killed on drop.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use shardctl_common::split::shard_range;
use support::{eventually, shardctl, Cli, Process, BIN};

// ---------------------------------------------------------------------------------------------
// 1. dispatch rejections: a clear message, exit 2, nothing written to Redis

#[test]
fn dispatch_rejects_zero_shards() {
    let cli = Cli::start("zero-shards");
    cli.rejects(&["dispatch", "--shards", "0"], 2, "shards must be at least 1");
    cli.rejects(&["dispatch", "--shards", "0", "--items", "10"], 2, "shards must be at least 1");
}

#[test]
fn dispatch_rejects_items_below_shards() {
    let cli = Cli::start("few-items");
    cli.rejects(
        &["dispatch", "--shards", "10", "--items", "9"],
        2,
        "items (9) must be at least the number of shards (10)",
    );
    cli.rejects(&["dispatch", "--shards", "10", "--items", "0"], 2, "must be at least the number of shards");
}

#[test]
fn dispatch_rejects_an_existing_task_id_and_keeps_the_first_task() {
    let cli = Cli::start("dup-id");
    assert_eq!(cli.ok(&["dispatch", "--shards", "4", "--items", "40", "--task-id", "dup"]).trim(), "dup");
    let first: HashMap<String, String> = redis::cmd("HGETALL").arg(cli.key("task:dup")).query(&mut cli.con()).unwrap();
    assert_eq!(first.get("total").map(String::as_str), Some("4"), "{first:?}");

    cli.rejects(
        &["dispatch", "--shards", "7", "--items", "70", "--kind", "noop", "--task-id", "dup"],
        2,
        "a task with id 'dup' already exists",
    );
    let after: HashMap<String, String> = redis::cmd("HGETALL").arg(cli.key("task:dup")).query(&mut cli.con()).unwrap();
    assert_eq!(after, first, "the first task changed");
    let t = cli.json(&["status", "dup", "--json"], 0);
    assert_eq!((t["kind"].as_str(), t["total"].as_u64()), (Some("primes"), Some(4)), "{t}");
}

#[test]
fn dispatch_rejects_bad_task_ids() {
    let cli = Cli::start("bad-ids");
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", "a:b"], 2, "task id 'a:b' has the character ':'");
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", "a b"], 2, "task id 'a b' has the character ' '");
    let long = "a".repeat(65);
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", &long], 2, "task id must be 1 to 64 bytes, got 65");
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", ""], 2, "task id must be 1 to 64 bytes, got 0");
    // the longest id is accepted
    let max = "b".repeat(64);
    assert_eq!(cli.ok(&["dispatch", "--shards", "1", "--task-id", &max]).trim(), max);
}

#[test]
fn a_built_in_kinds_payload_is_checked_before_anything_is_written() {
    let cli = Cli::start("builtin-payload");
    cli.rejects(&["dispatch", "--kind", "sleep", "--shards", "3"], 2, r#"kind sleep needs a payload {"ms":N}"#);
    cli.rejects(&["dispatch", "--kind", "sleep", "--shards", "3", "--payload", r#"{"secs":1}"#], 2, "unknown field");
    cli.rejects(
        &["dispatch", "--kind", "fail", "--shards", "3", "--payload", r#"{"rate":2}"#],
        2,
        "a rate from 0 to 1",
    );
    cli.rejects(
        &["schedule", "add", "nightly", "--cron", "0 2 * * *", "--kind", "sleep", "--shards", "3"],
        2,
        r#"kind sleep needs a payload {"ms":N}"#,
    );
    cli.ok(&["dispatch", "--kind", "sleep", "--shards", "3", "--payload", r#"{"ms":1}"#]);
}

#[test]
fn dispatch_rejects_a_payload_that_is_not_json() {
    let cli = Cli::start("bad-json");
    cli.rejects(&["dispatch", "--shards", "1", "--payload", "{nope"], 2, "payload is not valid JSON");
    cli.rejects(&["dispatch", "--shards", "1", "--payload", ""], 2, "payload is not valid JSON");
    cli.rejects(&["dispatch", "--shards", "1", "--payload", "{\"a\":1} trailing"], 2, "payload is not valid JSON");
}

/// The 1 MiB rule cannot be reached through argv on Linux: one argument is limited to
/// MAX_ARG_STRLEN (128 KiB), so the kernel refuses to start the process (E2BIG) before shardctl
/// sees the payload, and the CLI has no other way to take a payload (no file, no stdin). Where the
/// platform lets the argument through, the binary must reject it.
#[test]
fn dispatch_payload_over_1_mib() {
    let cli = Cli::start("big-payload");
    let payload = format!("\"{}\"", "x".repeat((1 << 20) - 1)); // 1 MiB + 1 byte of JSON
    assert_eq!(payload.len(), (1 << 20) + 1);
    let spawned = std::process::Command::new(support::BIN)
        .args(["--redis", &cli.redis.url(), "--queue", &cli.queue, "dispatch", "--shards", "1", "--payload", &payload])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        Err(e) => {
            // E2BIG: "Argument list too long"
            assert_eq!(e.raw_os_error(), Some(7), "unexpected spawn error: {e}");
            assert_eq!(cli.dbsize(), 0);
        }
        Ok(mut child) => {
            let _ = child.kill();
            let _ = child.wait();
            cli.rejects(&["dispatch", "--shards", "1", "--payload", &payload], 2, "the limit is 1048576 (1 MiB)");
        }
    }
    // through --payload-file the limit is reachable: 1 MiB + 1 is refused, 1 MiB is stored
    let dir = std::env::temp_dir().join(format!("shardctl-payload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("big.json");
    std::fs::write(&file, &payload).unwrap();
    let f = file.to_str().unwrap();
    cli.rejects(&["dispatch", "--shards", "1", "--payload-file", f], 2, "is over the limit of 1048576 bytes (1 MiB)");
    assert_eq!(cli.dbsize(), 0);
    let exact = format!("\"{}\"", "z".repeat((1 << 20) - 2));
    std::fs::write(&file, &exact).unwrap();
    assert_eq!(cli.ok(&["dispatch", "--shards", "1", "--task-id", "exact", "--payload-file", f]).trim(), "exact");
    let stored: String = redis::cmd("HGET").arg(cli.key("task:exact")).arg("payload").query(&mut cli.con()).unwrap();
    assert_eq!(stored.len(), 1 << 20);
    cli.rejects(&["dispatch", "--shards", "1", "--payload-file", "/nonexistent/p.json"], 2, "cannot read payload file");
    std::fs::remove_dir_all(&dir).unwrap();
    // the largest payload argv carries is accepted and stored as given
    let payload = format!("\"{}\"", "y".repeat(100 * 1024));
    assert_eq!(cli.ok(&["dispatch", "--shards", "1", "--task-id", "big", "--payload", &payload]).trim(), "big");
    let stored: String = redis::cmd("HGET").arg(cli.key("task:big")).arg("payload").query(&mut cli.con()).unwrap();
    assert_eq!(stored, payload);
}

#[test]
fn dispatch_rejects_bad_backoff() {
    let cli = Cli::start("bad-backoff");
    cli.rejects(&["dispatch", "--shards", "1", "--backoff", "linear:1s"], 2, "kind must be fixed or exponential");
    cli.rejects(&["dispatch", "--shards", "1", "--backoff", "fixed"], 2, "expected fixed:D or exponential:D");
    let out = cli.rejects(&["dispatch", "--shards", "1", "--backoff", "fixed:soon"], 2, "--backoff");
    assert!(out.stderr.contains("invalid value 'fixed:soon'"), "{out:?}");
}

#[test]
fn dispatch_usage_errors_exit_2() {
    let cli = Cli::start("usage");
    cli.rejects(&["dispatch"], 2, "--shards");
    cli.rejects(&["dispatch", "--items", "10"], 2, "--shards N is required");
    cli.rejects(&["dispatch", "--shards", "-1"], 2, "'-1'");
    cli.rejects(&["dispatch", "--shards", "ten"], 2, "invalid value 'ten'");
    cli.rejects(&["dispatch", "--shards", "1", "--attempts", "0"], 2, "attempts must be at least 1");
    cli.rejects(&["dispatch", "--shards", "1", "--kind", "two words"], 2, "kind 'two words'");
    cli.rejects(&["dispatch", "--shards", "1", "--no-such-flag"], 2, "--no-such-flag");
    cli.rejects(&["no-such-command"], 2, "no-such-command");
    for (queue, needle) in [("a:b", "queue name 'a:b' has the character ':'"), ("", "queue name must be 1 to 64 bytes")]
    {
        let out = shardctl(&["--redis", &cli.redis.url(), "--queue", queue, "dispatch", "--shards", "1"]);
        assert_eq!(out.code(), 2, "queue {queue:?}: {out:?}");
        assert!(out.stderr.contains(needle), "queue {queue:?}: {out:?}");
        assert!(out.stderr.contains("A-Z a-z 0-9 . _ -"), "queue {queue:?}: {out:?}");
    }
    assert_eq!(cli.dbsize(), 0);
}

// ---------------------------------------------------------------------------------------------
// 2. Redis unreachable or misnamed

#[test]
fn unreachable_redis_is_a_clear_error() {
    for args in [&["dispatch", "--shards", "1"][..], &["status"], &["status", "t1"], &["wait", "t1"]] {
        let mut all = vec!["--redis", "redis://127.0.0.1:1"];
        all.extend_from_slice(args);
        let out = shardctl(&all);
        assert_eq!(out.code(), 1, "{all:?}: {out:?}");
        assert!(out.stderr.contains("cannot connect to redis at 127.0.0.1:1"), "{all:?}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "{all:?}: {out:?}");
    }
}

#[test]
fn malformed_redis_url_is_a_clear_error() {
    for url in ["not a url", "http://127.0.0.1:6379", "redis://127.0.0.1:port"] {
        let out = shardctl(&["--redis", url, "status"]);
        assert_eq!(out.code(), 2, "{url}: {out:?}");
        assert!(out.stderr.contains("invalid redis URL"), "{url}: {out:?}");
    }
}

#[test]
fn redis_password_is_never_printed() {
    let cases: [&[&str]; 6] = [
        &["--redis", "redis://user:secret@127.0.0.1:1", "status"],
        &["--redis", "redis://user:secret@127.0.0.1:1", "--log", "trace", "dispatch", "--shards", "1"],
        &["--redis", "redis://:secret@127.0.0.1:1", "wait", "t1"],
        &["--redis", "redis://user:secret@127.0.0.1:1", "executor", "--node-id", "n1"],
        &["--redis", "redis://user:secret@127.0.0.1:port", "status"],
        &["--redis", "http://user:secret@127.0.0.1:1", "status"],
    ];
    for args in cases {
        let out = shardctl(args);
        assert_ne!(out.code(), 0, "{args:?}: {out:?}");
        assert!(out.stderr.contains("error:"), "{args:?}: {out:?}");
        assert!(
            !out.stderr.contains("secret") && !out.stdout.contains("secret"),
            "password printed: {args:?}: {out:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. What dispatch and status print

#[test]
fn dispatch_prints_the_task_id() {
    let cli = Cli::start("print-id");
    let id = cli.ok(&["dispatch", "--shards", "3"]);
    let id = id.trim();
    assert!(!id.is_empty() && !id.contains(char::is_whitespace), "{id:?}");
    let exists: i64 = redis::cmd("EXISTS").arg(cli.key(&format!("task:{id}"))).query(&mut cli.con()).unwrap();
    assert_eq!(exists, 1, "no task hash for the printed id {id}");

    assert_eq!(cli.ok(&["dispatch", "--shards", "3", "--task-id", "named"]), "named\n");
    let v = cli.json(&["dispatch", "--shards", "3", "--task-id", "as-json", "--json"], 0);
    assert_eq!(v, json!({ "task_id": "as-json" }));
    let v = cli.json(&["dispatch", "--shards", "3", "--json"], 0);
    let generated = v["task_id"].as_str().expect("task_id");
    assert_ne!(generated, id, "two generated ids are the same");
    let t = cli.json(&["status", generated, "--json"], 0);
    assert_eq!(t["task_id"], json!(generated));
}

#[test]
fn status_of_a_task() {
    let cli = Cli::start("status-task");
    cli.ok(&["dispatch", "--shards", "5", "--items", "50", "--kind", "noop", "--task-id", "s1"]);
    let t = cli.json(&["status", "s1", "--json"], 0);
    for field in ["task_id", "kind", "state", "total", "done", "failed", "result"] {
        assert!(t.get(field).is_some(), "status --json lacks {field}: {t}");
    }
    assert_eq!(t["task_id"], json!("s1"));
    assert_eq!(t["kind"], json!("noop"));
    assert_eq!(t["state"], json!("running"));
    assert_eq!((t["total"].as_u64(), t["done"].as_u64(), t["failed"].as_u64()), (Some(5), Some(0), Some(0)));
    assert_eq!(t["result"], Value::Null);

    let text = cli.ok(&["status", "s1"]);
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(&words[..3], ["s1", "noop", "running"], "{text}");
    assert!(text.contains("[------------------------]   0.0% 0/5 (0 failed)"), "a bar, counts: {text}");
    assert!(text.contains("eta "), "{text}");

    let out = cli.run(&["status", "nope"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("no task 'nope'"), "{out:?}");
}

#[test]
fn status_of_the_queue() {
    let cli = Cli::start("status-queue");
    let text = cli.ok(&["status"]);
    assert!(text.contains("queue status-queue: 0 waiting, 0 active, 0 delayed"), "{text}");
    assert!(text.contains("tasks: none"), "{text}");

    cli.ok(&["dispatch", "--shards", "5", "--task-id", "q1"]);
    cli.ok(&["dispatch", "--shards", "2", "--task-id", "q2"]);
    let text = cli.ok(&["status"]);
    assert!(text.contains("queue status-queue: 7 waiting, 0 active, 0 delayed"), "{text}");
    assert!(text.contains("tasks: 2 running"), "{text}");
    for id in ["q1", "q2"] {
        let line = text.lines().find(|l| l.trim_start().starts_with(id)).unwrap_or_else(|| panic!("{id}: {text}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[1..3], ["primes", "running"], "{line}");
    }

    // columns fit the longest id and kind: the bars line up
    let long = "a-task-id-of-sixty-four-characters-".to_owned() + &"x".repeat(29);
    cli.ok(&["dispatch", "--shards", "1", "--task-id", &long, "--kind", "a-rather-long-kind-name"]);
    let text = cli.ok(&["status"]);
    let bars: Vec<usize> =
        text.lines().filter(|l| l.starts_with("  ") && l.contains('[')).map(|l| l.find('[').unwrap()).collect();
    assert_eq!(bars.len(), 3, "{text}");
    assert!(bars.iter().all(|b| *b == bars[0]), "columns do not line up:\n{text}");
    let one = cli.ok(&["status", &long]);
    assert!(one.starts_with(&format!("{long}  a-rather-long-kind-name  running")), "{one}");

    let q = cli.json(&["status", "--json"], 0);
    assert_eq!(q["queue"], json!("status-queue"));
    assert_eq!(q["waiting"], json!(8));
    assert_eq!(q["active"], json!(0));
    assert_eq!(q["delayed"], json!(0));
    assert_eq!(q["tasks"], json!({ "running": 3 }));
}

/// `status` and `wait` read `task:<id>` without checking the id, so an id that names another key
/// of the task (`<id>:results`, `<id>:errors`) is read as a task.
#[test]
fn status_and_wait_refuse_ids_that_cannot_be_tasks() {
    let cli = Cli::start("id-aliasing");
    let _e = cli.executor("alias-1", &[]);
    let t = cli.json(&["dispatch", "--shards", "3", "--items", "30", "--task-id", "t1", "--wait", "--json"], 0);
    assert_eq!(t["state"], json!("completed"));
    // Regression: status and wait once read `task:<id>` unchecked, so `t1:results` (t1's results
    // hash) showed as a phantom task; an id outside [A-Za-z0-9._-] is now bad usage.
    let out = cli.run(&["status", "t1:results", "--json"]);
    assert_eq!(out.code(), 2, "a phantom task: {out:?}");
    let out = cli.run(&["wait", "t1:results", "--timeout", "1s"]);
    assert_ne!(out.code(), 0, "{out:?}");
    assert!(!out.stderr.contains("timed out"), "waited for a phantom task: {out:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. A full run through real executor processes

#[test]
fn full_run_through_executor_processes() {
    let cli = Cli::start("full-run");
    let mut e1 = cli.executor("full-1", &[]);
    let mut e2 = cli.executor("full-2", &[]);
    let args = ["dispatch", "--shards", "100", "--items", "100000", "--task-id", "p1", "--wait", "--json"];
    let out = cli.run(&args);
    assert_eq!(out.code(), 0, "{out:?}\nexecutor 1:\n{}\nexecutor 2:\n{}", e1.log(), e2.log());
    let t: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
    assert_eq!(t["result"], json!({ "primes": 9592 }), "{t}");
    assert_eq!(t["state"], json!("completed"));
    assert_eq!((t["total"].as_u64(), t["done"].as_u64(), t["failed"].as_u64()), (Some(100), Some(100), Some(0)));

    // `wait` on a finished task answers at once with the same result
    let w = cli.json(&["wait", "p1", "--json"], 0);
    assert_eq!(w["result"], json!({ "primes": 9592 }));
    let text = cli.ok(&["wait", "p1"]);
    assert!(text.contains("result: {\"primes\":9592}"), "{text}");

    for (n, e) in [&mut e1, &mut e2].into_iter().enumerate() {
        let st = e.terminate();
        assert_eq!(st.code(), Some(0), "executor {} after SIGTERM: {st:?}\n{}", n + 1, e.log());
    }
}

// ---------------------------------------------------------------------------------------------
// 5. wait exit codes

/// A kind no live executor serves would wait forever: dispatch says so at once, naming what
/// is served (a typo such as `prime`), unless told to queue it anyway. Executors announce
/// their kinds with their membership; one running `--exec --kinds '*'` serves every kind.
#[test]
fn dispatch_refuses_a_kind_no_live_executor_serves() {
    let cli = Cli::start("unserved");
    // no executor live: nothing can be said, the task waits
    cli.ok(&["dispatch", "--kind", "prime", "--shards", "1", "--task-id", "early"]);
    let mut e = cli.executor("builtins", &[]);
    eventually("the executor joined", Duration::from_secs(20), || {
        let s = cli.ok(&["status"]);
        s.contains("builtins").then_some(()).ok_or(s)
    });
    cli.rejects(
        &["dispatch", "--kind", "prime", "--shards", "1"],
        2,
        "no live executor serves kind 'prime'; served: fail, noop, primes, sleep",
    );
    let out = cli.run(&["dispatch", "--kind", "prime", "--shards", "1", "--task-id", "anyway", "--unserved"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stderr.contains("its shards wait until an executor serving it starts"), "{out:?}");
    e.terminate();
    let _any = cli.executor("anything", &["--exec", "true"]);
    eventually("the --exec executor joined", Duration::from_secs(20), || {
        let s = cli.ok(&["status"]);
        (s.contains("anything") && !s.contains("builtins")).then_some(()).ok_or(s)
    });
    cli.ok(&["dispatch", "--kind", "prime", "--shards", "1", "--task-id", "served"]);
}

#[test]
fn results_streams_every_shards_outcome_in_shard_order_over_partitions_too() {
    let cli = Cli::start("results");
    let _e = cli.executor("res-1", &[]);
    let payload = r#"{"rate":0.5}"#;
    let args =
        ["dispatch", "--kind", "fail", "--payload", payload, "--shards", "10", "--attempts", "1", "--task-id", "f"];
    let t = cli.json(&[&args[..], &["--wait", "--json"]].concat(), 3);
    let out = cli.ok(&["results", "f"]);
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 10, "{out}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["shard"], json!(i), "{out}");
    }
    let errors = lines.iter().filter(|l| l.get("error").is_some()).count() as u64;
    assert_eq!(Some(errors), t["failed"].as_u64(), "{out}");

    // over 2 partitions: each share's results at the task's indexes
    cli.ok(&["config", "--partitions", "2"]);
    let t = cli.json(&["dispatch", "--shards", "6", "--items", "1000", "--task-id", "p", "--wait", "--json"], 0);
    assert_eq!(t["partitions"], json!(2), "{t}");
    let out = cli.ok(&["results", "p"]);
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shards: Vec<u64> = lines.iter().map(|l| l["shard"].as_u64().unwrap()).collect();
    assert_eq!(shards, (0..6).collect::<Vec<_>>(), "{out}");
    let primes: u64 = lines.iter().map(|l| l["result"]["primes"].as_u64().unwrap()).sum();
    assert_eq!(primes, 168, "{out}");
    // (not `rejects`: the end of `p` is still being passed on to its shares in the background)
    let out = cli.run(&["results", "nope"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("no task 'nope'"), "{out:?}");
}

#[test]
fn wait_exits_3_when_shards_fail_and_status_lists_them() {
    let cli = Cli::start("wait-fail");
    let _e = cli.executor("fail-1", &[]);
    let id =
        cli.ok(&["dispatch", "--shards", "4", "--kind", "fail", "--payload", r#"{"rate":1.0}"#, "--attempts", "1"]);
    let id = id.trim();
    let out = cli.run(&["wait", id]);
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(out.stdout.contains(&format!("task {id} failed: 0 of 4 shards done, 4 failed")), "{out:?}");
    // the reasons, counted, and where to see each shard
    assert!(out.stdout.contains("failures by reason:\n        4 × injected failure"), "{out:?}");
    assert!(out.stdout.contains(&format!("each failed shard: `shardctl status {id} --failed`")), "{out:?}");

    let t = cli.json(&["wait", id, "--json"], 3);
    assert_eq!(t["state"], json!("failed"));
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(0), Some(4)));

    let text = cli.ok(&["status", id, "--failed"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("shard {i}: injected failure")), "{text}");
    }
    let failed = cli.json(&["status", id, "--failed", "--json"], 0);
    let failed = failed.as_array().expect("an array");
    assert_eq!(failed.len(), 4, "{failed:?}");
    for (i, f) in failed.iter().enumerate() {
        assert_eq!(f["shard"], json!(i));
        assert!(f["reason"].as_str().unwrap_or("").contains("injected failure (rate 1, attempt 1)"), "{f}");
    }
}

#[test]
fn wait_times_out_with_exit_1() {
    let cli = Cli::start("wait-timeout");
    cli.ok(&["dispatch", "--shards", "2", "--task-id", "idle"]);
    let out = cli.run(&["wait", "idle", "--timeout", "300ms"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("timed out"), "{out:?}");
    let out = cli.run(&["dispatch", "--shards", "2", "--task-id", "idle2", "--wait", "--timeout", "300ms"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("timed out"), "{out:?}");
    // the task is still there, untouched
    let t = cli.json(&["status", "idle", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64()), (Some("running"), Some(0)));
}

#[test]
fn wait_on_a_missing_task_exits_1() {
    let cli = Cli::start("wait-missing");
    let out = cli.run(&["wait", "nope"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("no task 'nope'"), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// 6. The --exec protocol through the binary

#[test]
fn exec_and_aggregate_exec_through_the_binary() {
    let cli = Cli::start("exec");
    // sh is the user's command here: shardctl itself runs it without a shell
    let _e = cli.executor(
        "exec-1",
        &["--exec", "sh -c 'echo $((SHARDCTL_RANGE_END - SHARDCTL_RANGE_START))'", "--aggregate-exec", "sh -c 'wc -l'"],
    );
    let args = ["dispatch", "--kind", "mine", "--shards", "10", "--items", "95", "--task-id", "m1", "--wait", "--json"];
    let t = cli.json(&args, 0);
    assert_eq!(t["state"], json!("completed"), "{t}");
    assert_eq!(t["result"], json!(10), "the aggregator counts one line per shard: {t}");
    // a built-in kind keeps its own aggregation: --aggregate-exec is for the kinds --exec runs
    let t = cli.json(&["dispatch", "--kind", "noop", "--shards", "3", "--wait", "--json"], 0);
    assert_eq!(t["result"], json!({ "completed": 3, "failed": 0 }), "{t}");

    let results: HashMap<u64, String> =
        redis::cmd("HGETALL").arg(cli.key("task:m1:results")).query(&mut cli.con()).unwrap();
    assert_eq!(results.len(), 10, "{results:?}");
    for i in 0..10 {
        let r = shard_range(i, 10, 95);
        assert_eq!(results.get(&i), Some(&(r.end - r.start).to_string()), "shard {i}: {results:?}");
    }
}

// A handler that leaves a process running in the background (holding its stdout and stderr
// open) ends its shard when it exits: its output is what it wrote by then (read 1 s more).
#[test]
fn a_handler_that_leaves_a_background_process_ends_its_shard_when_it_exits() {
    let cli = Cli::start("exec-bg");
    let _e = cli.executor("exec-bg", &["--exec", "sh -c 'sleep 25 & echo $SHARDCTL_SHARD_INDEX'"]);
    let args = ["dispatch", "--kind", "bg", "--shards", "2", "--task-id", "bg", "--wait", "--timeout", "15s", "--json"];
    let t = cli.json(&args, 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64()), (Some("completed"), Some(2)), "{t}");
    let results: HashMap<u64, String> =
        redis::cmd("HGETALL").arg(cli.key("task:bg:results")).query(&mut cli.con()).unwrap();
    assert_eq!(results, HashMap::from([(0, "0".to_owned()), (1, "1".to_owned())]));
}

// A cancel stops the running handlers within about a second: an executor holding shards reads
// the queue's cancel count every second, not only at its heartbeat (half the lock duration: 30 s
// here, past this test's patience).
#[test]
fn a_cancel_stops_running_handlers_before_the_next_heartbeat() {
    let cli = Cli::start("cancel-fast");
    let args = [
        "executor",
        "--node-id",
        "cf",
        "--concurrency",
        "2",
        "--lock-duration",
        "60s",
        "--exec",
        "sleep 50",
        "--kinds",
        "*",
    ];
    let mut e = cli.background("cf", &args);
    cli.ok(&["dispatch", "--kind", "slow", "--shards", "2", "--task-id", "slow"]);
    eventually("both shards running", Duration::from_secs(20), || {
        let q = cli.json(&["status", "--json"], 0);
        (q["active"] == json!(2)).then_some(()).ok_or(q)
    });
    // past the executor's first beat, which a poll may bring forward
    std::thread::sleep(Duration::from_millis(1500));
    cli.ok(&["cancel", "slow"]);
    eventually("the handlers stopped", Duration::from_secs(10), || {
        let log = e.log();
        (log.matches("task cancelled: stopping its handler").count() == 2).then_some(()).ok_or(log)
    });
    assert!(e.terminate().success(), "{}", e.log());
}

#[test]
fn a_kind_without_a_handler_waits_and_says_why() {
    let cli = Cli::start("no-handler");
    let _e = cli.executor("lonely-node", &[]);
    eventually("the executor joined", Duration::from_secs(20), || {
        let s = cli.ok(&["status"]);
        s.contains("lonely-node").then_some(()).ok_or(s)
    });
    // queued anyway: no executor takes it (none serves it), none fails it, and `wait` says why
    let args =
        ["dispatch", "--kind", "nobody", "--shards", "3", "--task-id", "n1", "--unserved", "--wait", "--timeout"];
    let out = cli.run(&[&args[..], &["3s"]].concat());
    assert_ne!(out.code(), 0, "{out:?}");
    assert!(out.stderr.contains("no live executor serves kind 'nobody'; served: fail, noop, primes, sleep"), "{out:?}");
    let t = cli.json(&["status", "n1", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()), (Some("running"), Some(0), Some(0)));

    // the empty case says so
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "fine", "--wait"]);
    let text = cli.ok(&["status", "fine", "--failed"]);
    assert_eq!(text.trim(), "task fine: no failed shards", "{text}");
}

// ---------------------------------------------------------------------------------------------
// 7. Executor bad arguments

#[test]
fn executor_rejects_bad_arguments() {
    let cli = Cli::start("executor-args");
    let cases: [(&[&str], &str); 17] = [
        (&["--lock-duration", "2s", "--lock-renew", "2s"], "must be above zero and below the lock duration"),
        (&["--lock-duration", "2s", "--lock-renew", "3s"], "must be above zero and below the lock duration"),
        (&["--lock-renew", "0s"], "must be above zero"),
        (&["--concurrency", "0"], "concurrency must be at least 1"),
        (&["--exec", "'unclosed", "--kinds", "r"], "--exec: unclosed single quote"),
        (&["--aggregate-exec", "'unclosed"], "--aggregate-exec: unclosed single quote"),
        (&["--exec", "  ", "--kinds", "r"], "--exec: empty command"),
        // checked at start: a typo is an error then, not a failure of every shard
        (
            &["--exec", "/tmp/shardctl-no-such-handler.sh", "--kinds", "r"],
            "--exec: '/tmp/shardctl-no-such-handler.sh' is not an executable file",
        ),
        (
            &["--exec", "shardctl-no-such-command --flag", "--kinds", "r"],
            "--exec: 'shardctl-no-such-command' is not found in PATH",
        ),
        // the kinds a handler runs are said, never assumed
        (&["--exec", "true"], "--kinds"),
        (&["--worker", "true"], "--kinds"),
        (&["--exec", "true", "--kinds", "a,,b"], "empty kind"),
        (&["--exec", "true", "--kinds", "a:b"], "kind 'a:b' has the character ':'"),
        (&["--exec", "true", "--kinds", "primes"], "'primes' is a built-in kind"),
        (&["--kinds", "report"], "--kinds names the kinds --exec or --worker runs"),
        (&["--aggregate-exec", "/dev/null"], "--aggregate-exec: '/dev/null' is not an executable file"),
        (&["--lock-duration", "soon"], "--lock-duration"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["executor", "--node-id", "bad-args"];
        args.extend_from_slice(extra);
        cli.rejects(&args, 2, needle);
    }
}

/// Issue 11, defect 4: `node:<id>` of node `a:wait` was node a's routed list `node:a:wait`, and
/// `n{x}` moved the node's keys out of the queue's slot. Both are refused before anything runs.
#[test]
fn executor_refuses_node_ids_that_would_form_other_keys() {
    let cli = Cli::start("node-ids");
    let allowed = "allowed are 1 to 64 bytes of A-Z a-z 0-9 . _ -";
    let long = "n".repeat(65);
    let cases: [(&str, &str); 6] = [
        ("a:wait", "node id 'a:wait' has the character ':' at byte 1"),
        ("n{x}", "node id 'n{x}' has the character '{' at byte 1"),
        ("x}", "node id 'x}' has the character '}' at byte 1"),
        ("é", "node id 'é' has the character 'é' at byte 0"),
        ("", "node id must be 1 to 64 bytes, got 0"),
        (&long, "node id must be 1 to 64 bytes, got 65"),
    ];
    for (node, needle) in cases {
        let out = cli.rejects(&["executor", "--node-id", node, "--lock-duration", "2s"], 2, needle);
        assert!(out.stderr.contains("A-Z a-z 0-9 . _ -"), "{node:?}: {out:?}");
        if !node.is_empty() && node.len() <= 64 {
            assert!(out.stderr.contains(allowed), "{node:?}: {out:?}");
        }
    }
    // no executor joined under any of them
    let nodes: Vec<String> = redis::cmd("ZRANGE").arg(cli.key("nodes")).arg(0).arg(-1).query(&mut cli.con()).unwrap();
    assert!(nodes.is_empty(), "{nodes:?}");
}

/// Every command that takes a name refuses a bad one the same way: exit 2, a message naming the
/// kind and the offending character, nothing written.
#[test]
fn every_command_refuses_names_that_would_form_other_keys() {
    let cli = Cli::start("bad-names");
    cli.ok(&["dispatch", "--shards", "1", "--task-id", "x"]);
    let keys = cli.dbsize();
    // a task id on every command that takes one
    let task = "task id 'x:terminal' has the character ':' at byte 1";
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", "x:terminal"], 2, task);
    cli.rejects(&["dispatch", "--shards", "1", "--task-id", "x{y}"], 2, "task id 'x{y}' has the character '{'");
    let cmds = [
        &["status", "x:terminal"][..],
        &["status", "x:terminal", "--failed"],
        &["wait", "x:terminal"],
        &["results", "x:terminal"],
    ];
    for cmd in cmds {
        cli.rejects(cmd, 2, task);
    }
    for cmd in ["cancel", "retry"] {
        cli.rejects(&[cmd, "x:terminal"], 2, task);
    }
    // schedule names
    let add = |name: &'static str| ["schedule", "add", name, "--cron", "@daily", "--shards", "1"];
    cli.rejects(&add("n{x}"), 2, "schedule name 'n{x}' has the character '{' at byte 1");
    cli.rejects(&add("a:last"), 2, "schedule name 'a:last' has the character ':'");
    cli.rejects(&["schedule", "remove", "a:task"], 2, "schedule name 'a:task' has the character ':'");
    cli.rejects(&["schedule", "remove", ""], 2, "schedule name must be 1 to 40 bytes, got 0");
    // lock names keep ':' and '/', not braces or spaces; `lock`'s own errors exit 125 (its
    // command's codes pass through, see `shardctl lock --help`)
    let lock = |name: &'static str| ["lock", name, "--", "true"];
    cli.rejects(
        &lock("n{x}"),
        125,
        "lock name 'n{x}' has the character '{' at byte 1; allowed are 1 to 128 bytes of A-Z a-z 0-9 . _ : / -",
    );
    cli.rejects(&lock("a b"), 125, "lock name 'a b' has the character ' '");
    assert_eq!(cli.dbsize(), keys);
    // --queue and --prefix on every command, before anything runs
    let commands: [&[&str]; 18] = [
        &["dispatch", "--shards", "1"],
        &["executor"],
        &["coordinator"],
        &["status"],
        &["wait", "x"],
        &["demo"],
        &["ring", "simulate"],
        &["lock", "l", "--", "true"],
        &["pause"],
        &["resume"],
        &["cancel", "x"],
        &["retry", "x"],
        &["clean"],
        &["limit"],
        &["schedule", "list"],
        &["watch"],
        &["config"],
        &["bench"],
    ];
    let url = cli.redis.url();
    for cmd in commands {
        for (flag, name, needle) in [
            ("--queue", "x:wait", "queue name 'x:wait' has the character ':' at byte 1"),
            ("--queue", "q}", "queue name 'q}' has the character '}' at byte 1"),
            ("--prefix", "p:lock", "key prefix 'p:lock' has the character ':' at byte 1"),
        ] {
            let mut args = vec!["--redis", url.as_str(), flag, name];
            args.extend_from_slice(cmd);
            let out = shardctl(&args);
            let usage = if cmd[0] == "lock" { 125 } else { 2 };
            assert_eq!(out.code(), usage, "{args:?}: {out:?}");
            assert!(out.stderr.contains(needle), "{args:?}: {out:?}");
            assert!(out.stderr.contains("allowed are 1 to 64 bytes of A-Z a-z 0-9 . _ -"), "{args:?}: {out:?}");
        }
    }
    assert_eq!(cli.dbsize(), keys);
}

// ---------------------------------------------------------------------------------------------
// 8. demo

#[test]
fn demo_runs_end_to_end() {
    let out = shardctl(&["demo", "--shards", "50", "--items", "100000", "--executors", "2"]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stdout.contains("9592"), "{out:?}");
    assert!(out.stdout.contains("checked: 9592 primes below 100000"), "{out:?}");
    let out = shardctl(&["demo", "--executors", "0"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("--executors must be at least 1"), "{out:?}");
}

#[test]
fn demo_stopped_by_sigterm_leaves_no_redis_server() {
    let mut demo = Process::spawn(
        support::command(&["demo", "--shards", "1000", "--items", "1000000000", "--executors", "1"]),
        "demo",
    );
    // a hang guard, not a time assertion
    let url = eventually("the demo to say it dispatched", Duration::from_secs(60), || {
        let log = demo.log();
        let url = log.lines().find_map(|l| l.strip_prefix("started a private redis-server at "));
        match (url, log.contains("dispatched task")) {
            (Some(u), true) => Ok(u.trim().to_owned()),
            _ => Err(log.clone()),
        }
    });
    let pid = demo.pid();
    demo.signal("TERM");
    let _ = demo.wait_exit(Duration::from_secs(60));
    // shut down a server the demo left behind, so that the test leaks nothing either way
    let left_behind = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .map(|mut con| {
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut con);
        })
        .is_ok();
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("shardctl-demo-{pid}")));
    // Regression: the demo once had no signal handler, so SIGTERM orphaned its redis-server.
    assert!(!left_behind, "the demo's redis-server at {url} outlived the demo stopped by SIGTERM");
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let cli = Cli::start("pipe");
    for i in 0..5 {
        cli.ok(&["dispatch", "--shards", "1", "--kind", "noop", "--task-id", &format!("p{i}")]);
    }
    // `head -c 0` exits at once: the first line status prints meets a closed pipe
    let line = format!(
        "set -o pipefail; {BIN} --redis {} --queue pipe status | head -c 0; echo \"exit ${{PIPESTATUS[0]}}\" >&2",
        cli.redis.url()
    );
    let out = std::process::Command::new("bash").args(["-c", &line]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim(), "exit 0", "no panic, no error on a closed stdout: {stderr}");

    // a stdout that fails otherwise (a full disk) is an error, with a message and no panic
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out =
        support::command(&["--redis", &cli.redis.url(), "--queue", "pipe", "status"]).stdout(full).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("writing to stdout") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn status_failed_needs_a_task() {
    let cli = Cli::start("failed-flag");
    cli.rejects(&["status", "--failed"], 2, "<TASK>");
}

// A wait that cannot end says why instead of looking hung: no executor, a paused queue, a delay.
#[test]
fn a_wait_that_cannot_progress_says_why() {
    let cli = Cli::start("stuck");
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "lonely"]);
    let out = cli.run(&["wait", "lonely", "--timeout", "3s"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("task lonely is not moving: no executor is running for this queue"), "{out:?}");
    assert!(out.stderr.contains("timed out after 3s: no executor is running"), "the timeout says why: {out:?}");
    assert!(out.stderr.contains("(none has joined it)"), "{out:?}");

    // an executor, but the queue paused
    cli.ok(&["pause"]);
    let mut e = cli.executor("stuck-a", &[]);
    let out = cli.run(&["wait", "lonely", "--timeout", "4s"]);
    assert_eq!(out.code(), 1, "{out:?}\n{}", e.log());
    assert!(out.stderr.contains("the queue is paused"), "{out:?}");
    assert!(!out.stderr.contains("no executor"), "an executor runs: {out:?}");
    cli.ok(&["resume"]);
    cli.ok(&["wait", "lonely", "--timeout", "30s"]);

    // a delayed task
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "1", "--task-id", "later", "--delay", "1h"]);
    let out = cli.run(&["wait", "later", "--timeout", "3s", "--json"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("the task is delayed: it starts in"), "{out:?}");
    // status says when, not an unknown ETA
    let line = cli.ok(&["status"]);
    let line = line.lines().find(|l| l.trim_start().starts_with("later ")).unwrap_or_else(|| panic!("{line}"));
    assert!(line.contains("delayed") && line.contains("starts in") && !line.contains("eta ?"), "{line}");
    // the executor leaves gracefully: a wait still says when one was last seen
    assert!(e.terminate().success(), "{}", e.log());
    let out = cli.run(&["wait", "later", "--timeout", "3s"]);
    assert!(out.stderr.contains("no executor is running for this queue (the last one was seen"), "{out:?}");
}

// A crashed executor, reaped: the queue records when it was last heard of (its last heartbeat,
// before the kill), not when its membership ran out (a member timeout later), so `wait` says
// how long ago the last executor was seen.
#[test]
fn a_reaped_executor_is_recorded_as_last_heard_at_its_last_heartbeat() {
    let cli = Cli::start("reaped");
    let args = ["executor", "--node-id", "gone", "--member-heartbeat", "300ms", "--member-timeout", "3s"];
    let mut e = cli.background("gone", &args);
    eventually("the executor to join", Duration::from_secs(20), || {
        let q = cli.json(&["status", "--json"], 0);
        (q["nodes"].as_array().is_some_and(|n| n.len() == 1)).then_some(()).ok_or(q)
    });
    e.kill();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut cli.con()).unwrap();
    let killed_ms = secs * 1000 + micros / 1000;
    let _c = cli.background("co", &["coordinator", "--metrics-addr", "off", "--ui-addr", "off", "--refresh", "500ms"]);
    let seen: u64 = eventually("the executor reaped", Duration::from_secs(30), || {
        let v: Option<u64> = redis::cmd("HGET").arg(cli.key("meta")).arg("last_left_ms").query(&mut cli.con()).unwrap();
        v.ok_or("not reaped yet")
    });
    assert!(seen <= killed_ms, "last heard at {seen}, after the kill at {killed_ms}");
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "1", "--task-id", "orphan"]);
    let out = cli.run(&["wait", "orphan", "--timeout", "3s"]);
    assert!(out.stderr.contains("no executor is running for this queue (the last one was seen"), "{out:?}");
}

// `--log debug` shows each shard (claimed, started, ended with its time and outcome) and what a
// handler wrote on stderr although it succeeded.
#[test]
fn debug_logs_follow_each_shard_and_keep_a_handlers_stderr() {
    let cli = Cli::start("debug-log");
    let exec = r#"sh -c 'echo "note from $SHARDCTL_SHARD_INDEX" >&2; echo 1'"#;
    let mut e =
        cli.background("dbg", &["--log", "debug", "executor", "--node-id", "dbg", "--exec", exec, "--kinds", "*"]);
    cli.ok(&["dispatch", "--kind", "talk", "--shards", "2", "--task-id", "chatty", "--wait", "--timeout", "30s"]);
    eventually("the shards' lines in the debug log", Duration::from_secs(30), || {
        let log = e.log();
        let ok = log.contains("claimed")
            && log.matches("shard started").count() >= 2
            && log.matches("shard ended: completed").count() >= 2
            && log.contains("handler stderr: note from 0")
            && log.contains("handler stderr: note from 1");
        ok.then_some(()).ok_or(log)
    });
    assert!(e.terminate().success(), "{}", e.log());

    // over partitions a ref's index is the share's own: the lines name the task's index too
    cli.ok(&["config", "--partitions", "3"]);
    let mut e =
        cli.background("dbgp", &["--log", "debug", "executor", "--node-id", "dbgp", "--exec", exec, "--kinds", "*"]);
    cli.ok(&["dispatch", "--kind", "talk", "--shards", "6", "--task-id", "spread", "--wait", "--timeout", "30s"]);
    eventually("each shard's own line in the debug log", Duration::from_secs(30), || {
        let log = e.log();
        let ended = |i: u32| {
            log.lines().any(|l| l.contains("shard ended: completed") && l.contains(&format!("shard {i} of the task")))
        };
        (0..6).all(ended).then_some(()).ok_or(log)
    });
    assert!(e.terminate().success(), "{}", e.log());
}

// `--log-format json`: every log line is one JSON object with its fields under their names and
// their types (the stats at a stop as numbers, not a debug dump of a struct).
#[test]
fn json_logs_are_one_object_per_line_with_typed_fields() {
    let cli = Cli::start("json-log");
    let mut e = cli.background("jl", &["--log-format", "json", "--log", "debug", "executor", "--node-id", "jl"]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "j", "--wait", "--timeout", "30s"]);
    assert!(e.terminate().success(), "{}", e.log());
    let log = e.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("not JSON ({err}): {l}\n{log}")))
        .collect();
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()), "{log}");
    let started = lines.iter().find(|l| l["fields"]["message"] == "executor started").expect("a start line");
    assert_eq!(started["fields"]["node"], "jl", "{log}");
    let stopped = lines.iter().find(|l| l["fields"]["message"] == "executor stopped").expect("a stop line");
    // the three shards and the aggregation job
    assert_eq!(stopped["fields"]["claimed"], 4, "{log}");
    assert_eq!(stopped["fields"]["completed"], 3, "{log}");
    assert_eq!(stopped["fields"]["aggregated"], 1, "{log}");
    assert!(!log.contains("StatsSnapshot"), "{log}");
    cli.rejects(&["--log-format", "xml", "status"], 2, "invalid value 'xml'");
}

// Help keeps the global options under their own heading; an option taken from the environment
// is not printed in an error's usage line; the environment gives what the command line does not,
// and the command line wins; a dispatch option a schedule cannot take says why.
#[test]
fn help_and_usage_keep_global_options_and_the_environment_apart() {
    let help = shardctl(&["status", "--help"]);
    assert_eq!(help.code(), 0, "{help:?}");
    let (options, global) = help.stdout.split_once("Global options:").unwrap_or_else(|| panic!("{help:?}"));
    assert!(options.contains("--json") && options.contains("--failed"), "{help:?}");
    assert!(
        !options.contains("--redis") && !options.contains("--queue"),
        "global options among the command's: {help:?}"
    );
    assert!(global.contains("--redis <URL>") && global.contains("SHARDCTL_REDIS"), "{help:?}");

    let mut c = support::command(&["status", "--failed"]);
    c.env("SHARDCTL_REDIS", "redis://user:s3cret@127.0.0.1:1").env("SHARDCTL_QUEUE", "q");
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let usage = err.lines().find(|l| l.starts_with("Usage:")).unwrap_or_else(|| panic!("{err}"));
    assert_eq!(usage, "Usage: shardctl status --failed <TASK>", "{err}");
    assert!(!err.contains("s3cret"), "{err}");

    let cli = Cli::start("env-queue");
    cli.ok(&["pause", "--queue", "from-cli"]);
    let mut c = support::command(&["--redis", &cli.redis.url(), "status"]);
    c.env("SHARDCTL_QUEUE", "from-env");
    let out = c.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("queue from-env: "), "{out:?}");
    let mut c = support::command(&["--redis", &cli.redis.url(), "status", "--queue", "from-cli"]);
    c.env("SHARDCTL_QUEUE", "from-env");
    let out = c.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("queue from-cli (paused): "), "{out:?}");
    let mut c = support::command(&["status"]);
    c.env("SHARDCTL_QUEUE", "a:b");
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SHARDCTL_QUEUE: queue name 'a:b'"), "{out:?}");

    let r = cli.rejects(
        &["schedule", "add", "s1", "--cron", "@hourly", "--shards", "2", "--task-id", "fixed"],
        2,
        "a schedule takes no --task-id: it names each task it creates <NAME>-<UTC fire time> (e.g. s1-",
    );
    assert!(!r.stderr.contains("'-- --task-id'"), "{r:?}");
    cli.rejects(&["schedule", "add", "s1", "--cron", "@hourly", "--shards", "2", "--wait"], 2, "`shardctl wait s1-");
    // a log filter that does not parse is refused, not replaced by the default in silence
    cli.rejects(&["--log", "bogus===", "status"], 2, "--log (or SHARDCTL_LOG) 'bogus===' is not a log filter");
}

// Every command says so when it has nothing to show, rather than printing nothing.
#[test]
fn every_command_says_when_it_has_nothing() {
    let cli = Cli::start("empty");
    let said = |args: &[&str], what: &str| {
        let out = cli.run(args);
        assert_eq!(out.code(), 0, "{args:?}: {out:?}");
        assert!(out.stdout.contains(what) || out.stderr.contains(what), "{args:?} should say '{what}': {out:?}");
    };
    said(&["status"], "tasks: none");
    said(&["status"], "executors: none live");
    said(&["status"], "coordinators: none live");
    said(&["schedule", "list"], "no schedules");
    said(&["limit"], "no rate limit");
    said(&["clean"], "removed 0 ended tasks");
    let watch = |args: &[&str], note: &str| {
        let mut w = cli.background("watch", args);
        eventually("watch to say what it waits for", Duration::from_secs(20), || {
            let log = w.log();
            log.contains(note).then_some(()).ok_or(log)
        });
        w.kill();
    };
    watch(&["watch"], "showing the events of queue empty as they come (none yet)");
    watch(&["watch", "--from-start"], "the event log of queue empty is empty; waiting for events");
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "1", "--task-id", "fine"]);
    said(&["status", "fine", "--failed"], "task fine: no failed shards");
    watch(&["watch"], "showing the events of queue empty as they come (1 older one kept: --from-start shows it)");
    cli.ok(&["config", "--events-maxlen", "0"]);
    watch(&["watch"], "the event log of queue empty is off");
}

// A Redis stall longer than the response timeout (10 s) but shorter than the locks: the
// reporter's call in flight times out, Redis then runs it (the outcomes are recorded) and the
// reply is lost; the call sent again finds the locks gone. Those outcomes are the executor's
// own, found recorded: counted as completed, retried or failed, no "outcome refused" warning.
#[test]
fn outcomes_whose_reply_was_lost_in_a_redis_stall_count_as_recorded() {
    let cli = Cli::start("lost-reply");
    let info: String = redis::cmd("INFO").arg("server").query(&mut cli.con()).unwrap();
    let pid: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process_id in {info}"));
    // odd shards fail their first attempt: completions and failures both in flight
    let exec = r#"sh -c 'cat >/dev/null; sleep 0.25; [ $((SHARDCTL_SHARD_INDEX % 2)) = 1 ] && [ "$SHARDCTL_ATTEMPT" = 1 ] && exit 1; echo 1'"#;
    let args =
        ["executor", "--node-id", "lr", "--concurrency", "4", "--lock-duration", "60s", "--exec", exec, "--kinds", "*"];
    let mut e = cli.background("lr", &args);
    let dispatch = ["dispatch", "--kind", "flaky", "--shards", "80", "--attempts", "2", "--backoff", "fixed:100ms"];
    cli.ok(&[&dispatch[..], &["--task-id", "stall"]].concat());
    eventually("shards ending", Duration::from_secs(30), || {
        let t = cli.json(&["status", "stall", "--json"], 0);
        (t["done"].as_u64().unwrap_or(0) >= 4).then_some(()).ok_or(t)
    });
    shardctl_testkit::signal(pid, "STOP");
    std::thread::sleep(Duration::from_millis(11_500));
    shardctl_testkit::signal(pid, "CONT");
    let t = cli.json(&["wait", "stall", "--timeout", "60s", "--json"], 0);
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(80), Some(0)), "{t}");
    assert!(e.terminate().success(), "{}", e.log());
    let log = e.log();
    assert!(log.contains("recording") && log.contains("outcomes failed"), "no call timed out in the stall: {log}");
    assert!(!log.contains("outcome refused"), "{log}");
    let stop = log.lines().find(|l| l.contains("executor stopped")).unwrap_or_else(|| panic!("{log}"));
    assert!(stop.contains("completed=80") && stop.contains("retried=40") && stop.contains("refused=0"), "{stop}");
}
