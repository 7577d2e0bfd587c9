//! Failures a handler classifies and fail-fast (docs/design/failure-policies.md) through the
//! binary, with real handlers: the Python worker's `Permanent` (each such shard runs once; with
//! `--max-failures` the task fails at once with its reason, and `retry` runs only what did not
//! complete), `--exec` exit codes (permanent, retry-after on the server's clock, fail-task,
//! `--exit-code`), and a halt while shards run on two executors, one of them SIGKILLed: the task
//! ends once, its handlers stop, the aggregation never runs.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::Cli;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardctl-fp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// An executable script `name` in `dir`.
fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = write(dir, name, body);
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// How many times each index appears as a line of `log` (missing: none ran).
fn runs(log: &Path) -> HashMap<u64, u32> {
    let mut n = HashMap::new();
    for l in std::fs::read_to_string(log).unwrap_or_default().lines() {
        if let Some(i) = l.split_whitespace().next().and_then(|w| w.parse().ok()) {
            *n.entry(i).or_default() += 1;
        }
    }
    n
}

const REPORT: &str = r#"
import os, sys
from shardctl_worker import serve, Permanent
LOG, FIXED = sys.argv[1], sys.argv[2]
def handle(s):
    with open(LOG, "a") as f:
        f.write("%d %d\n" % (s.index, s.attempt))
    if s.index % 10 == 3 and not os.path.exists(FIXED):
        raise Permanent("malformed date in row %d" % s.start)
    return s.end - s.start
serve(handle)
"#;

#[test]
fn permanent_failures_run_once_and_max_failures_fails_the_task_at_once_then_retry_mends_it() {
    let dir = tempdir("newcomer");
    let w = write(&dir, "report.py", REPORT);
    let (log, fixed) = (dir.join("runs.log"), dir.join("fixed"));
    let cmd = format!("python3 {} {} {}", w.display(), log.display(), fixed.display());
    let cli =
        Cli::start("fp-newcomer").with_env("PYTHONPATH", &format!("{}/clients/python", env!("CARGO_MANIFEST_DIR")));
    let ex = cli.executor("n1", &["--worker", &cmd, "--concurrency", "4"]);

    // without a limit: each of the 60 runs once (no backoff of 30 s is waited), the task fails
    let report = ["dispatch", "--kind", "report", "--shards", "600", "--backoff", "fixed:30s"];
    let t = cli.json(&[&report[..], &["--task-id", "all", "--wait", "--json"][..]].concat(), 3);
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(540), Some(60)), "{t}\n{}", ex.log());
    let n = runs(&log);
    assert!((0..600).all(|i| n.get(&i) == Some(&1)), "every shard, failing ones too, ran exactly once");
    std::fs::remove_file(&log).unwrap();

    // with --max-failures 10: failed fast, well before a backoff step of 30 s would pass
    let started = Instant::now();
    let out = cli.run(&[&report[..], &["--max-failures", "10", "--task-id", "fast", "--wait"][..]].concat());
    let took = started.elapsed();
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(took < Duration::from_secs(25), "failed fast only after {took:?}");
    assert!(
        out.stdout.contains("failed fast: 11 of 600 shards failed for good (limit 10); first: shard ")
            && out.stdout.contains("Permanent: malformed date in row "),
        "{out:?}"
    );
    let s = cli.json(&["status", "fast", "--json"], 0);
    assert_eq!(
        (s["state"].as_str(), s["failed"].as_u64(), s["max_failures"].as_u64()),
        (Some("failed"), Some(11), Some(10))
    );
    assert!(s["halted"].as_str().unwrap().starts_with("failed fast: 11 of 600"), "{s}");
    assert!(s["done"].as_u64().unwrap() < 589, "{s}");
    let status = cli.ok(&["status", "fast"]);
    assert!(status.contains("failed fast: 11 of 600"), "{status}");
    // shards held ahead may start until their executor's next heartbeat tells it of the halt
    std::thread::sleep(Duration::from_millis(2500));
    let before = runs(&log);
    assert!(before.values().all(|&k| k == 1), "no shard ran twice before the halt");
    assert_eq!(cli.events("task_halted").len(), 1);
    let terminal: Vec<bool> = {
        let mut con = cli.con();
        (0..600)
            .map(|i| redis::cmd("GETBIT").arg(cli.key("task:fast:terminal")).arg(i).query::<u8>(&mut con).unwrap() == 1)
            .collect()
    };

    // the input is mended: retry runs the 11 failed and those never finished, no completed one
    std::fs::write(&fixed, "").unwrap();
    let out = cli.ok(&["retry", "fast"]);
    assert!(out.contains("failed and stopped shards queued again"), "{out}");
    let t = cli.json(&["wait", "fast", "--timeout", "60s", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(600), Some(0)),
        "{t}"
    );
    assert!(t["halted"].is_null(), "{t}");
    let after = runs(&log);
    for i in 0..600u64 {
        let ran = before.get(&i).copied().unwrap_or(0);
        let completed = terminal[i as usize] && i % 10 != 3;
        // a completed shard never runs again; a failed, stopped or never started one once more
        let want = ran + u32::from(!completed);
        assert_eq!(
            after.get(&i).copied().unwrap_or(0),
            want,
            "shard {i} (ran {ran} before the retry, completed: {completed})"
        );
    }
}

const EXEC: &str = r#"#!/bin/sh
i=$SHARDCTL_SHARD_INDEX
echo "$i $SHARDCTL_ATTEMPT $(date +%s%N)" >> "$LOG"
case "$SHARDCTL_TASK_ID:$i" in
  codes:1) echo "bad row" >&2; exit 65 ;;
  codes:2) if [ "$SHARDCTL_ATTEMPT" = 1 ]; then echo '{"retry_after_ms":900}'; echo "429" >&2; exit 75; fi ;;
  codes:3) if [ "$SHARDCTL_ATTEMPT" = 1 ]; then exit 9; fi ;;
  codes:4) exit 1 ;;
  fatal:0) printf 'connecting\nno API_TOKEN in the environment\n' >&2; exit 78 ;;
esac
sleep 0.05
echo 1
"#;

#[test]
fn exit_codes_say_permanent_retry_after_and_fail_task() {
    let dir = tempdir("exec");
    let h = executable(&dir, "h.sh", EXEC);
    let log = dir.join("runs.log");
    let cli = Cli::start("fp-exec").with_env("LOG", log.to_str().unwrap());
    let h = h.to_str().unwrap();
    cli.rejects(&["executor", "--exec", h, "--kinds", "k", "--exit-code", "later=3"], 2, "not a failure class");
    let _ex = cli.executor("x1", &["--exec", h, "--exit-code", "permanent=9", "--concurrency", "4"]);

    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "k",
            "--shards",
            "6",
            "--attempts",
            "3",
            "--backoff",
            "fixed:100ms",
            "--task-id",
            "codes",
            "--wait",
            "--json",
        ],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(3), Some(3)), "{t}");
    let reasons = cli.json(&["status", "codes", "--failed", "--json"], 0);
    let why: HashMap<u64, String> = reasons
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["shard"].as_u64().unwrap(), e["reason"].as_str().unwrap().to_owned()))
        .collect();
    assert!(why[&1].contains("exited with status 65 (permanent): bad row"), "{why:?}");
    assert!(
        why[&3].contains("exited with status 9 (permanent)"),
        "--exit-code permanent=9 replaced nothing else: {why:?}"
    );
    assert!(why[&4].contains("exited with status 1"), "{why:?}");
    let n = runs(&log);
    // permanent: once; a plain failure: every attempt; a retry-after: one more attempt
    assert_eq!((n[&1], n[&3], n[&4], n[&2]), (1, 1, 3, 2), "{n:?}");
    // the retry-after's second attempt came no sooner than the 900 ms it asked for
    let times: Vec<i128> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("2 "))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    let gap = Duration::from_nanos((times[1] - times[0]) as u64);
    assert!(gap >= Duration::from_millis(850), "the second attempt came {gap:?} after the first");
    assert_eq!(cli.events("shard_deferred").len(), 1);

    // a schedule carries the limit, taken of its shards
    cli.ok(&[
        "schedule",
        "add",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--kind",
        "k",
        "--shards",
        "40",
        "--max-failures",
        "10%",
    ]);
    let list = cli.json(&["schedule", "list", "--json"], 0);
    assert_eq!(list[0]["fields"]["max_failures"], 4, "{list}");
    cli.rejects(&["dispatch", "--kind", "k", "--shards", "4", "--max-failures", "5 %x"], 2, "percentage");

    let t = cli.json(&["dispatch", "--kind", "k", "--shards", "40", "--task-id", "fatal", "--wait", "--json"], 3);
    assert_eq!(
        t["halted"].as_str(),
        Some("failed by its handler: shard 0 asked to fail the task: no API_TOKEN in the environment"),
        "{t}"
    );
    assert_eq!(t["failed"].as_u64(), Some(1), "{t}");
}

const SLOW: &str = r#"#!/bin/sh
i=$SHARDCTL_SHARD_INDEX
echo "s $i $(date +%s%N)" >> "$LOG"
if [ $((i % 7)) = 3 ]; then sleep 0.1; echo "bad input at $i" >&2; exit 65; fi
sleep 0.4
echo "e $i $(date +%s%N)" >> "$LOG"
echo 1
"#;

#[test]
fn a_limit_crossed_on_two_executors_one_killed_ends_the_task_once_without_aggregation() {
    let dir = tempdir("halt");
    let h = executable(&dir, "h.sh", SLOW);
    let agg = executable(&dir, "agg.sh", &format!("#!/bin/sh\ntouch {}/aggregated\necho 0\n", dir.display()));
    let log = dir.join("runs.log");
    let cli = Cli::start("fp-halt").with_env("LOG", log.to_str().unwrap());
    let (h, agg) = (h.to_str().unwrap(), agg.to_str().unwrap());
    let mut a = cli.executor("a", &["--exec", h, "--aggregate-exec", agg, "--concurrency", "4"]);
    let _b = cli.executor("b", &["--exec", h, "--aggregate-exec", agg, "--concurrency", "4"]);
    cli.ok(&["dispatch", "--kind", "k", "--shards", "200", "--max-failures", "5%", "--task-id", "h"]);
    // a dies while it runs shards
    support::eventually("a runs shards", Duration::from_secs(20), || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        if l.lines().filter(|l| l.starts_with("s ")).count() >= 12 {
            Ok(())
        } else {
            Err("fewer than 12 started")
        }
    });
    a.kill();
    let t = cli.json(&["wait", "h", "--timeout", "60s", "--json"], 3);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["max_failures"].as_u64(), Some(10), "5% of 200");
    assert_eq!(t["failed"].as_u64(), Some(11), "{t}");
    assert!(
        t["halted"].as_str().unwrap().starts_with("failed fast: 11 of 200 shards failed for good (limit 10)"),
        "{t}"
    );
    // nothing starts after the halt, what ran is stopped, the aggregation never runs
    let halted_at = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let starts = |text: &str| text.lines().filter(|l| l.starts_with("s ")).count();
    let before = std::fs::read_to_string(&log).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let after = std::fs::read_to_string(&log).unwrap();
    assert_eq!(starts(&before), starts(&after), "shards started after the halt ({:?} after it)", halted_at.elapsed());
    assert!(!dir.join("aggregated").exists(), "the aggregation ran after a fail-fast");
    assert_eq!(cli.events("task_halted").len(), 1);
    assert_eq!(cli.events("task_failed").len(), 1);
    let st = cli.json(&["status", "h", "--json"], 0);
    assert!(st["done"].as_u64().unwrap() + st["failed"].as_u64().unwrap() < 200, "{st}");
}

#[test]
fn a_worker_that_cannot_start_is_said_by_wait_and_status_with_its_error() {
    let dir = tempdir("nostart");
    let w = write(&dir, "w.py", "import shardctl_no_such_module\n");
    let cli = Cli::start("fp-nostart");
    let _ex = cli.executor("ns", &["--worker", &format!("python3 {}", w.display())]);
    let out =
        cli.run(&["dispatch", "--kind", "report", "--shards", "20", "--task-id", "r", "--wait", "--timeout", "8s"]);
    let said = format!("{}{}", out.stdout, out.stderr);
    assert_ne!(out.code(), 0, "{out:?}");
    let want = "the worker of kind 'report' fails to start, its shards retry in vain: ModuleNotFoundError: No module named 'shardctl_no_such_module'";
    assert!(said.contains(want), "{out:?}");
    let status = cli.ok(&["status", "r"]);
    assert!(status.contains(want), "{status}");
    // its shards are not failed for good: they retry, and `status --failed` lists none yet
    let failed = cli.ok(&["status", "r", "--failed"]);
    assert!(failed.contains("no failed shards"), "{failed}");
}

const PARTED: &str = r#"#!/bin/sh
i=$SHARDCTL_SHARD_INDEX
echo "$i $SHARDCTL_ATTEMPT" >> "$LOG"
if [ $((i % 5)) = 0 ] && [ "$i" -lt 30 ] && [ ! -e "$FIXED" ]; then echo "bad row $i" >&2; exit "${CODE:-65}"; fi
sleep 0.2
echo 1
"#;

/// The shares' states of task `id` over the queue's partitions (`config --json` names them).
fn share_states(cli: &Cli, id: &str) -> Vec<Option<String>> {
    let v = cli.json(&["config", "--json"], 0);
    let tags: Vec<String> =
        v["partition_tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    let mut con = cli.con();
    tags.iter()
        .map(|t| redis::cmd("HGET").arg(format!("{{{t}}}:task:{id}")).arg("state").query(&mut con).unwrap())
        .collect()
}

#[test]
fn over_partitions_the_home_fails_fast_once_stops_every_share_and_retry_mends_it() {
    let dir = tempdir("parts");
    let h = executable(&dir, "h.sh", PARTED);
    let (log, fixed) = (dir.join("runs.log"), dir.join("fixed"));
    let cli = Cli::start("fp-parts").with_env("LOG", log.to_str().unwrap()).with_env("FIXED", fixed.to_str().unwrap());
    cli.json(&["config", "--partitions", "3", "--json"], 0);
    let exec = h.to_str().unwrap();
    let _a = cli.executor("p1", &["--exec", exec, "--concurrency", "3"]);
    let _b = cli.executor("p2", &["--exec", exec, "--concurrency", "3"]);
    // only the first share's shards fail (0, 5, ... 25): the others are halted with no failure
    // of their own, and their retry runs only what they left unfinished
    let out = cli.run(&[
        "dispatch",
        "--kind",
        "rows",
        "--shards",
        "90",
        "--max-failures",
        "3",
        "--task-id",
        "pf",
        "--wait",
        "--timeout",
        "60s",
    ]);
    assert_eq!(out.code(), 3, "{out:?}");
    assert!(out.stdout.contains("failed fast: ") && out.stdout.contains("(limit 3); first: shard "), "{out:?}");
    let s = cli.json(&["status", "pf", "--json"], 0);
    assert_eq!((s["state"].as_str(), s["max_failures"].as_u64()), (Some("failed"), Some(3)), "{s}");
    let (done, failed) = (s["done"].as_u64().unwrap(), s["failed"].as_u64().unwrap());
    // (the first share's failures cross the limit while the others run: how far they got
    // depends on the machine, not that they stopped)
    assert!(failed >= 4 && done + failed < 90, "the task stopped early, counted over its shares: {s}");
    // every share stops as its home decided, at once (its running handlers too)
    let deadline = Instant::now() + Duration::from_secs(10);
    while share_states(&cli, "pf").iter().any(|st| st.as_deref() != Some("failed")) {
        assert!(Instant::now() < deadline, "shares still running: {:?}", share_states(&cli, "pf"));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let before = runs(&log);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(runs(&log), before, "no shard starts after the shares stopped");
    assert!(before.values().all(|&k| k == 1), "no shard ran twice");
    assert_eq!(cli.events("task_halted").len(), 1, "decided once");
    assert!(cli.events("task_aggregating").is_empty(), "a halted task never aggregates");

    // mended: retry runs what did not complete, in every share, and the task completes
    std::fs::write(&fixed, "").unwrap();
    cli.ok(&["retry", "pf"]);
    let t = cli.json(&["wait", "pf", "--timeout", "60s", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(90), Some(0)),
        "{t}"
    );
    assert!(t["halted"].is_null(), "{t}");
    let after = runs(&log);
    assert!((0..90u64).all(|i| after.contains_key(&i)), "every shard ran");
    assert!(after.values().all(|&k| k <= 2), "no shard ran more than once again: {after:?}");
}

#[test]
fn over_partitions_a_handlers_fail_task_halts_the_whole_task_and_retry_mends_it() {
    let dir = tempdir("parts-fatal");
    let h = executable(&dir, "h.sh", PARTED);
    let (log, fixed) = (dir.join("runs.log"), dir.join("fixed"));
    let cli = Cli::start("fp-parts-fatal")
        .with_env("LOG", log.to_str().unwrap())
        .with_env("FIXED", fixed.to_str().unwrap())
        .with_env("CODE", "78");
    cli.json(&["config", "--partitions", "3", "--json"], 0);
    let _ex = cli.executor("p1", &["--exec", h.to_str().unwrap(), "--concurrency", "4"]);
    let t = cli.json(
        &["dispatch", "--kind", "rows", "--shards", "90", "--task-id", "fp", "--wait", "--timeout", "60s", "--json"],
        3,
    );
    let why = t["halted"].as_str().unwrap_or_default();
    assert!(why.starts_with("failed by its handler: shard ") && why.contains("asked to fail the task: "), "{t}");
    assert!(why.contains("bad row "), "{t}");
    // its counts are its shares' (none of them counted in the home)
    let (done, failed) = (t["done"].as_u64().unwrap(), t["failed"].as_u64().unwrap());
    assert!(failed >= 1 && done + failed < 90, "it stopped early: {t}");
    assert_eq!(cli.events("task_halted").len(), 1);
    // mended: the ask of the round before is forgotten, the task completes
    std::fs::write(&fixed, "").unwrap();
    cli.ok(&["retry", "fp"]);
    let t = cli.json(&["wait", "fp", "--timeout", "60s", "--json"], 0);
    assert_eq!((t["state"].as_str(), t["done"].as_u64()), (Some("completed"), Some(90)), "{t}");
    assert_eq!(cli.events("task_halted").len(), 1, "no second halt after the retry");
}

const K_OF_N: &str = r#"
import sys, time
from shardctl_worker import serve
def handle(s):
    # the last ten are stragglers
    time.sleep(0.02 if s.index < 30 else 20)
    return s.index
def aggregate(a):
    ok = [o.shard for o in a.outcomes if o.error is None]
    return {"shards": ok, "done": a.done, "cancelled": a.cancelled, "total": a.total}
serve(handle, aggregate)
"#;

#[test]
fn success_when_cancels_the_stragglers_and_aggregates_exactly_the_succeeded_shards() {
    k_of_n(1);
}

#[test]
fn over_partitions_success_when_aggregates_exactly_the_succeeded_shards() {
    k_of_n(3);
}

/// 40 shards, the last ten stragglers, `--success-when 75%`, over `partitions`.
fn k_of_n(partitions: u32) {
    let dir = tempdir(&format!("kofn{partitions}"));
    let w = write(&dir, "k.py", K_OF_N);
    let cmd = format!("python3 {}", w.display());
    let cli = Cli::start(&format!("fp-kofn{partitions}"))
        .with_env("PYTHONPATH", &format!("{}/clients/python", env!("CARGO_MANIFEST_DIR")));
    if partitions > 1 {
        cli.json(&["config", "--partitions", &partitions.to_string(), "--json"], 0);
    }
    // slots for every straggler and more: over partitions the claims take shards of every share
    // in turn, so stragglers start beside the others, never before them all
    let _ex = cli.executor("k1", &["--worker", &cmd, "--aggregate-worker", &cmd, "--concurrency", "12"]);
    let started = Instant::now();
    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "report",
            "--shards",
            "40",
            "--success-when",
            "75%",
            "--task-id",
            "k",
            "--wait",
            "--json",
        ],
        0,
    );
    // the stragglers (20 s each) were stopped: the task did not wait for them
    assert!(started.elapsed() < Duration::from_secs(18), "took {:?}\n{}", started.elapsed(), _ex.log());
    assert_eq!((t["state"].as_str(), t["success_when"].as_u64()), (Some("completed"), Some(30)), "{t}");
    let (done, cancelled) = (t["done"].as_u64().unwrap(), t["cancelled"].as_u64().unwrap());
    assert_eq!((done, cancelled, t["failed"].as_u64()), (30, 10, Some(0)), "{t}");
    let r = &t["result"];
    let want: Vec<u64> = (0..30).collect();
    assert_eq!(r["shards"], serde_json::json!(want), "the aggregation saw exactly the succeeded shards: {t}");
    assert_eq!((r["done"].as_u64(), r["cancelled"].as_u64()), (Some(30), Some(10)), "{t}");
    let status = cli.ok(&["status", "k"]);
    assert!(status.contains("10 cancelled"), "{status}");
    assert_eq!(cli.events("task_settled").len(), 1);
    let out = cli.run(&["retry", "k"]);
    assert!(out.code() != 0 && out.stderr.contains("met its --success-when"), "{out:?}");
}
