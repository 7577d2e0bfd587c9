//! Task and queue controls through the binary, with real executor processes: `dispatch --delay`,
//! `cancel`, `retry`, the queue-wide rate limit (`limit`) and retention (`--keep-results`,
//! `--retain`, `clean`). Handlers are small shell scripts (`--exec`) that record what ran and
//! when (`date +%s%N`, the same clock as the test's), so that the tests check what executors did,
//! not only what the task hash says.

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{eventually, lines, script, Cli};

/// Wall clock in ms since the epoch (what `date +%s%N` / 10^6 reads too).
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A private directory for one test's scripts and records.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardctl-control-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts `shardctl executor --node-id <node>` with the test defaults of `support` (concurrency
/// 2, lock 2s, sweep 500ms, block 200ms, grace 2s), each overridden by an option of `extra`.
fn executor(cli: &Cli, node: &str, extra: &[&str]) -> support::Process {
    let mut opts: Vec<(String, Option<String>)> = [
        ("--concurrency", "2"),
        ("--lock-duration", "2s"),
        ("--stalled-interval", "500ms"),
        ("--block-timeout", "200ms"),
        ("--grace", "2s"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), Some(v.to_string())))
    .collect();
    let mut it = extra.iter();
    while let Some(k) = it.next() {
        let v = it.next().expect("options come in pairs").to_string();
        match opts.iter_mut().find(|(o, _)| o == k) {
            Some(o) => o.1 = Some(v),
            None => opts.push((k.to_string(), Some(v))),
        }
    }
    let handler = opts.iter().any(|(k, _)| k == "--exec" || k == "--worker");
    if handler && !opts.iter().any(|(k, _)| k == "--kinds") {
        // a test not about kinds lets its --exec serve every kind
        opts.push(("--kinds".to_owned(), Some("*".to_owned())));
    }
    let mut args = vec!["executor".to_owned(), "--node-id".to_owned(), node.to_owned()];
    for (k, v) in opts {
        args.push(k);
        args.extend(v);
    }
    cli.background(node, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn status(cli: &Cli, id: &str) -> Value {
    cli.json(&["status", id, "--json"], 0)
}

/// Every key of task `id` left in the server: `task:<id>` and `task:<id>:*`.
fn keys_of(cli: &Cli, id: &str) -> Vec<String> {
    let mut con = cli.con();
    let mut all: Vec<String> = Vec::new();
    for pat in [cli.key(&format!("task:{id}")), cli.key(&format!("task:{id}:*"))] {
        let found: Vec<String> = redis::cmd("KEYS").arg(&pat).query(&mut con).unwrap();
        all.extend(found);
    }
    all
}

/// Whether `id` is a member of the queue's zset `set`.
fn in_zset(cli: &Cli, set: &str, id: &str) -> bool {
    let s: Option<f64> = redis::cmd("ZSCORE").arg(cli.key(set)).arg(id).query(&mut cli.con()).unwrap();
    s.is_some()
}

fn pttl(cli: &Cli, suffix: &str) -> i64 {
    redis::cmd("PTTL").arg(cli.key(suffix)).query(&mut cli.con()).unwrap()
}

/// Whether process `pid` still runs (a zombie, killed but not reaped yet, does not).
fn alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// Start times (ms since the epoch) of the records `<task> <index> <ns>` of task `id`.
/// A handler script in `dir` that appends `<task> <index> <ns>` to a records file when it
/// starts; returns the records file and the `--exec` line.
fn start_recorder(dir: &Path) -> (PathBuf, String) {
    let rec = dir.join("starts");
    let exec = script(
        dir,
        "h.sh",
        &format!("echo \"$SHARDCTL_TASK_ID $SHARDCTL_SHARD_INDEX $(date +%s%N)\" >> {}", rec.display()),
    );
    (rec, exec)
}

/// The recorded start times (ms) of task `id`, sorted.
fn sorted_starts(rec: &Path, id: &str) -> Vec<u64> {
    let mut t = starts_ms(&lines(rec), id);
    t.sort();
    t
}

/// No `window_ms` holds more than `n` of the sorted start times `t`.
fn assert_at_most_per_window(t: &[u64], n: usize, window_ms: u64) {
    for i in 0..t.len().saturating_sub(n) {
        assert!(
            t[i + n] - t[i] >= window_ms,
            "starts {i} and {} are {} ms apart: more than {n} within {window_ms} ms: {t:?}",
            i + n,
            t[i + n] - t[i]
        );
    }
}

fn starts_ms(records: &[String], id: &str) -> Vec<u64> {
    records
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| f[2].parse::<u64>().unwrap() / 1_000_000)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// delay

#[test]
fn a_delayed_task_starts_after_its_delay_and_undelayed_work_runs_first() {
    let cli = Cli::start("delay");
    let d = dir("delay");
    let (rec, exec) = start_recorder(&d);
    let t0 = now_ms();
    cli.ok(&["dispatch", "--kind", "rec", "--shards", "2", "--task-id", "later", "--delay", "1500ms"]);
    let s = status(&cli, "later");
    assert_eq!(s["state"], "delayed", "{s}");
    assert!(s["start_ms"].as_u64().unwrap() >= t0 + 1500, "{s}");
    // the queue's counts agree with the task's state: its 2 shards are delayed
    let q = cli.json(&["status", "--json"], 0);
    assert_eq!((q["delayed"].as_u64(), q["tasks"]["delayed"].as_u64()), (Some(2), Some(1)), "{q}");
    cli.ok(&["dispatch", "--kind", "rec", "--shards", "3", "--task-id", "now"]);
    let _e = executor(&cli, "d1", &["--concurrency", "1", "--exec", &exec]);
    cli.ok(&["wait", "now", "--timeout", "20s"]);
    assert_eq!(status(&cli, "later")["state"], "delayed", "started before its time");
    cli.ok(&["wait", "later", "--timeout", "20s"]);
    let r = lines(&rec);
    assert_eq!(r.len(), 5, "{r:?}");
    // every shard of the undelayed task ran before any of the delayed one
    let order: Vec<&str> = r.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(order, ["now", "now", "now", "later", "later"], "{r:?}");
    let first = *starts_ms(&r, "later").iter().min().unwrap();
    assert!(first >= t0 + 1500, "a delayed shard started {} ms after dispatch", first - t0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_blocked_executor_wakes_at_a_delayed_tasks_start_not_at_its_block_timeout() {
    let cli = Cli::start("wake");
    let d = dir("wake");
    let (rec, exec) = start_recorder(&d);
    let _e = executor(&cli, "w1", &["--block-timeout", "30s", "--exec", &exec]);
    // once it beats (its lease exists) it has claimed nothing and blocks on the marker, for up
    // to 30 s
    let mut con = cli.con();
    eventually("the executor to take its lease", Duration::from_secs(10), || {
        let leases: u64 = redis::cmd("ZCARD").arg(cli.key("leases")).query(&mut con).unwrap();
        (leases > 0).then_some(()).ok_or("no lease")
    });
    std::thread::sleep(Duration::from_millis(300));
    let t0 = now_ms();
    cli.ok(&["dispatch", "--kind", "rec", "--shards", "1", "--task-id", "late", "--delay", "1s"]);
    cli.ok(&["wait", "late", "--timeout", "20s"]);
    let took = now_ms() - t0;
    let first = starts_ms(&lines(&rec), "late")[0];
    assert!(first >= t0 + 1000, "started {} ms after dispatch, before its delay", first - t0);
    // the block timeout is 30 s: only the due time carried by the marker wakes it this soon
    assert!(took < 6000, "a 1s delay took {took} ms: the blocked executor did not wake at the start time");
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------------------------------
// cancel

#[test]
fn cancel_kills_running_handlers_drops_queued_refs_and_ends_the_task_cancelled() {
    let cli = Cli::start("cancel");
    let d = dir("cancel");
    let pids = d.join("pids");
    // `exec`: the pid recorded is the long-running handler process itself
    let exec = script(&d, "h.sh", &format!("echo \"$$ $SHARDCTL_SHARD_INDEX\" >> {}\nexec sleep 30", pids.display()));
    let timing = ["--lock-duration", "1s", "--lock-renew", "250ms", "--exec", &exec];
    cli.ok(&["dispatch", "--kind", "long", "--shards", "8", "--task-id", "doomed"]);
    // b holds 2 shards, then a 2 more; a stops with a short grace: its 2 shards are released to
    // `wait`, where they stay while b is full
    let b = executor(&cli, "b", &timing);
    eventually("2 handlers started", Duration::from_secs(10), || {
        (lines(&pids).len() >= 2).then_some(()).ok_or(b.log())
    });
    let mut a = executor(&cli, "a", &[&timing[..], &["--grace", "200ms"]].concat());
    eventually("4 handlers started", Duration::from_secs(10), || {
        (lines(&pids).len() >= 4).then_some(()).ok_or(a.log())
    });
    a.terminate();
    std::thread::sleep(Duration::from_millis(300));
    let started = lines(&pids);
    let running: Vec<String> =
        started.iter().map(|l| l.split(' ').next().unwrap().to_owned()).filter(|p| alive(p)).collect();
    assert_eq!(running.len(), 2, "b runs 2 handlers: {started:?}\n{}", b.log());
    let mut con = cli.con();
    let wait_len: i64 = redis::cmd("LLEN").arg(cli.key("kind:long:wait")).query(&mut con).unwrap();
    assert_eq!(wait_len, 2, "a's released shards wait for a claim");

    let t = Instant::now();
    let out = cli.ok(&["cancel", "doomed"]);
    assert!(out.contains("cancelled"), "{out}");
    // the heartbeat (every 250 ms) sees the cancellation and kills the handlers
    eventually("the handlers to stop after cancel", Duration::from_secs(3), || {
        running
            .iter()
            .all(|p| !alive(p))
            .then_some(())
            .ok_or_else(|| format!("{:?} after cancel\n{}", t.elapsed(), b.log()))
    });
    let log = b.log();
    assert_eq!(log.matches("task cancelled: stopping its handler").count(), 2, "{log}");
    assert!(!log.contains("lock lost"), "a cancellation is not a lost lock: {log}");
    let s = status(&cli, "doomed");
    assert_eq!(s["state"], "cancelled", "{s}");
    assert!(s["done"].as_u64().unwrap() + s["failed"].as_u64().unwrap() < 8, "{s}");
    assert!(s["result"].is_null() && s["aggregation_error"].is_null(), "no aggregation: {s}");
    // b has free slots now, the 2 released refs and 4 unclaimed shards: none of them may start
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(lines(&pids).len(), started.len(), "a shard of the cancelled task started: {:?}", lines(&pids));
    let wait_len: i64 = redis::cmd("LLEN").arg(cli.key("kind:long:wait")).query(&mut con).unwrap();
    assert_eq!(wait_len, 0, "the cancelled task's refs in wait are dropped by the next claim");
    let active: Vec<String> = redis::cmd("HKEYS").arg(cli.key("active")).query(&mut con).unwrap();
    assert!(active.iter().all(|r| !r.starts_with("doomed:")), "{active:?}");
    assert!(
        cli.key("x").len() > 1 && keys_of(&cli, "doomed").iter().all(|k| !k.ends_with(":shards")),
        "shard state left: {:?}",
        keys_of(&cli, "doomed")
    );
    let s = status(&cli, "doomed");
    assert!(s["result"].is_null(), "{s}");

    let w = cli.run(&["wait", "doomed", "--timeout", "5s"]);
    assert_eq!(w.code(), 4, "wait on a cancelled task: {w:?}");
    let again = cli.run(&["cancel", "doomed"]);
    assert_eq!(again.code(), 2, "{again:?}");
    assert!(again.stderr.contains("already ended"), "{again:?}");
    let none = cli.run(&["cancel", "ghost"]);
    assert_ne!(none.code(), 0, "{none:?}");
    assert!(none.stderr.contains("no task"), "{none:?}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_cancelled_delayed_task_never_runs_and_cannot_be_retried() {
    let cli = Cli::start("cancel-delayed");
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "dl", "--delay", "600ms"]);
    cli.ok(&["cancel", "dl"]);
    let _e = executor(&cli, "c1", &[]);
    std::thread::sleep(Duration::from_millis(1200));
    let s = status(&cli, "dl");
    assert_eq!(s["state"], "cancelled", "{s}");
    assert_eq!(s["done"], 0, "{s}");
    assert!(!in_zset(&cli, "scheduled", "dl"));
    let r = cli.run(&["retry", "dl"]);
    assert_eq!(r.code(), 2, "{r:?}");
    assert!(r.stderr.contains("cancelled"), "{r:?}");
    assert_eq!(status(&cli, "dl")["state"], "cancelled");
}

// ---------------------------------------------------------------------------------------------
// retry

#[test]
fn retry_reruns_only_the_failed_shards_with_fresh_attempts_and_aggregation_follows() {
    let cli = Cli::start("retry");
    let d = dir("retry");
    let runs = d.join("runs");
    // shards 1 and 3 fail on their first 3 runs; with --attempts 2 the task fails, and a retry
    // completes it only if it gives them 2 fresh attempts (runs 3 and 4)
    let exec = script(
        &d,
        "h.sh",
        &format!(
            "n=$(grep -c \"^$SHARDCTL_TASK_ID $SHARDCTL_SHARD_INDEX \" {r} 2>/dev/null)\n\
             echo \"$SHARDCTL_TASK_ID $SHARDCTL_SHARD_INDEX $SHARDCTL_ATTEMPT\" >> {r}\n\
             case $SHARDCTL_SHARD_INDEX in 1|3) [ \"${{n:-0}}\" -ge 3 ] || {{ echo boom >&2; exit 1; }};; esac\n\
             echo '{{\"ok\":1}}'",
            r = runs.display()
        ),
    );
    let _e = executor(&cli, "r1", &["--concurrency", "4", "--exec", &exec]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "flaky",
        "--shards",
        "5",
        "--task-id",
        "rt",
        "--attempts",
        "2",
        "--backoff",
        "fixed:50ms",
    ]);
    let w = cli.run(&["wait", "rt", "--timeout", "20s"]);
    assert_eq!(w.code(), 3, "{w:?}");
    let s = status(&cli, "rt");
    assert_eq!((s["done"].as_u64(), s["failed"].as_u64()), (Some(3), Some(2)), "{s}");
    let before = lines(&runs).len();
    assert_eq!(before, 3 + 2 * 2, "{:?}", lines(&runs));

    // a gap, so that the time since the retry and the time since dispatch differ
    std::thread::sleep(Duration::from_millis(1500));
    let out = cli.ok(&["retry", "rt"]);
    assert!(out.contains("2 failed shards"), "{out}");
    let w = cli.run(&["wait", "rt", "--timeout", "20s"]);
    assert_eq!(w.code(), 0, "a retried shard got fresh attempts: {w:?}\nruns {:?}", lines(&runs));
    // the time `wait` reports counts from the retry, with the time since dispatch beside it
    let secs = |after: &str| -> f64 {
        let at = w.stdout.find(after).unwrap_or_else(|| panic!("no '{after}' in {w:?}")) + after.len();
        w.stdout[at..].split('s').next().unwrap().parse().unwrap_or_else(|e| panic!("{e}: {w:?}"))
    };
    let (since_retry, since_dispatch) =
        (secs("completed: 5 of 5 shards done, 0 failed, in "), secs("since the retry ("));
    assert!(since_dispatch >= since_retry + 1.4, "{w:?}");
    let again: Vec<String> = lines(&runs)[before..].to_vec();
    let mut idx: Vec<&str> = again.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    idx.sort();
    assert_eq!(idx, ["1", "1", "3", "3"], "only the failed shards ran again: {again:?}");
    // numbered on, never an attempt number the handler already saw
    let mut attempts: Vec<&str> = again.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
    attempts.sort();
    assert_eq!(attempts, ["3", "3", "4", "4"], "{again:?}");
    let s = status(&cli, "rt");
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!((s["done"].as_u64(), s["failed"].as_u64()), (Some(5), Some(0)), "{s}");
    assert_eq!(s["result"], serde_json::json!({"completed": 5, "failed": 0}), "{s}");
    let errors: i64 = redis::cmd("HLEN").arg(cli.key("task:rt:errors")).query(&mut cli.con()).unwrap();
    assert_eq!(errors, 0);
    assert!(!in_zset(&cli, "running", "rt") && in_zset(&cli, "finished", "rt"));
    // nothing failed now: a retry has nothing to do
    let out = cli.ok(&["retry", "rt"]);
    assert!(out.contains("nothing to retry"), "{out}");

    // results not kept: a retry after the end is refused, the task stays as it was
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":1.0}"#,
        "--shards",
        "2",
        "--task-id",
        "gone",
        "--attempts",
        "1",
        "--keep-results",
        "false",
    ]);
    assert_eq!(cli.run(&["wait", "gone", "--timeout", "20s"]).code(), 3);
    let r = cli.run(&["retry", "gone"]);
    assert_eq!(r.code(), 2, "{r:?}");
    assert!(r.stderr.contains("keep-results"), "{r:?}");
    let s = status(&cli, "gone");
    assert_eq!((s["state"].as_str(), s["failed"].as_u64()), (Some("failed"), Some(2)), "{s}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn retry_of_a_failed_aggregation_runs_only_the_aggregation_again() {
    let cli = Cli::start("retry-agg");
    let d = dir("retry-agg");
    let runs = d.join("runs");
    let ok_file = d.join("ok");
    let exec = script(&d, "h.sh", &format!("echo \"shard $SHARDCTL_SHARD_INDEX\" >> {}", runs.display()));
    let agg = script(
        &d,
        "agg.sh",
        &format!(
            "cat > /dev/null\necho agg >> {r}\n[ -e {ok} ] || {{ echo 'agg broke' >&2; exit 1; }}\necho '{{\"sum\":42}}'",
            r = runs.display(),
            ok = ok_file.display()
        ),
    );
    let _e = executor(&cli, "g1", &["--exec", &exec, "--aggregate-exec", &agg]);
    cli.ok(&["dispatch", "--kind", "agg", "--shards", "3", "--task-id", "ag", "--attempts", "1"]);
    assert_eq!(cli.run(&["wait", "ag", "--timeout", "20s"]).code(), 3);
    let s = status(&cli, "ag");
    assert_eq!((s["done"].as_u64(), s["failed"].as_u64()), (Some(3), Some(0)), "{s}");
    assert!(s["aggregation_error"].as_str().unwrap_or("").contains("agg broke"), "{s}");
    let before = lines(&runs);
    assert_eq!(before.iter().filter(|l| *l == "agg").count(), 1, "{before:?}");

    std::fs::write(&ok_file, "").unwrap();
    let out = cli.ok(&["retry", "ag"]);
    assert!(out.contains("aggregation runs again"), "{out}");
    let w = cli.run(&["wait", "ag", "--timeout", "20s"]);
    assert_eq!(w.code(), 0, "{w:?}");
    let after = lines(&runs);
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(&after[before.len()..], ["agg"], "only the aggregation ran again");
    let s = status(&cli, "ag");
    assert_eq!(s["result"], serde_json::json!({"sum": 42}), "{s}");
    assert!(s["aggregation_error"].is_null(), "{s}");
    assert_eq!((s["done"].as_u64(), s["failed"].as_u64()), (Some(3), Some(0)), "{s}");
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------------------------------
// rate limit

#[test]
fn the_rate_limit_holds_across_three_executors_and_is_used_in_full() {
    let cli = Cli::start("limit");
    let d = dir("limit");
    let (rec, exec) = start_recorder(&d);
    // bad values are refused before anything is written
    cli.rejects(&["limit", "--max", "0", "--per", "1s"], 2, "--max");
    cli.rejects(&["limit", "--max", "3", "--per", "0s"], 2, "--per");
    cli.rejects(&["limit", "--max", "3"], 2, "--per");
    cli.rejects(&["limit", "--per", "1s"], 2, "--max");
    assert!(cli.ok(&["limit"]).contains("no rate limit"));

    const N: usize = 4;
    const D: u64 = 700;
    const TOTAL: usize = 14;
    let out = cli.ok(&["limit", "--max", &N.to_string(), "--per", &format!("{D}ms")]);
    assert!(out.contains("at most 4 shards start per 700ms"), "{out}");
    assert!(cli.ok(&["limit"]).contains("at most 4 shards start per 700ms"));
    let _e: Vec<_> =
        ["l1", "l2", "l3"].iter().map(|n| executor(&cli, n, &["--concurrency", "4", "--exec", &exec])).collect();
    std::thread::sleep(Duration::from_millis(500));
    cli.ok(&["dispatch", "--kind", "rec", "--shards", &TOTAL.to_string(), "--task-id", "lim"]);
    cli.ok(&["wait", "lim", "--timeout", "30s"]);
    let t = sorted_starts(&rec, "lim");
    assert_eq!(t.len(), TOTAL);
    // The limiter counts claims by Redis's clock; the records are taken when the handler script
    // runs, some ms later (fork/exec of sh, on a loaded machine). Two starts N apart in the log
    // were claimed at least D apart; their records can be closer by the difference of two such
    // delays, so they are checked against D minus a 100 ms margin. Without the limit the 12
    // slots start 12 shards within a few ms of each other, far inside any such window.
    assert_at_most_per_window(&t, N, D - 100);
    // and the limit is used: 14 shards at 4 per window start in 4 windows, the last starts
    // 3 windows (2.1 s) after the first, not much later (a loose bound: at least half the allowed throughput)
    let span = t[TOTAL - 1] - t[0];
    let windows = TOTAL.div_ceil(N) as u64 - 1;
    assert!(span >= windows * D - 100, "span {span} ms: {t:?}");
    assert!(span <= 2 * windows * D + D, "span {span} ms: the limiter held shards back far longer than needed: {t:?}");

    // off: the next task's 12 shards start at once
    assert!(cli.ok(&["limit", "--off"]).contains("no rate limit"));
    assert!(cli.ok(&["limit"]).contains("no rate limit"));
    let meta: Option<String> = redis::cmd("HGET").arg(cli.key("meta")).arg("limit_max").query(&mut cli.con()).unwrap();
    assert_eq!(meta, None);
    cli.ok(&["dispatch", "--kind", "rec", "--shards", "12", "--task-id", "free"]);
    cli.ok(&["wait", "free", "--timeout", "30s"]);
    let f = sorted_starts(&rec, "free");
    assert_eq!(f.len(), 12);
    assert!(f[N] - f[0] < D - 100, "without a limit {} shards started within {} ms: {f:?}", N + 1, f[N] - f[0]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_limited_executor_waits_the_exact_time_the_limiter_returns_not_its_block_timeout() {
    let cli = Cli::start("limit-exact");
    let d = dir("limit-exact");
    let (rec, exec) = start_recorder(&d);
    cli.ok(&["limit", "--max", "2", "--per", "400ms"]);
    let _e = executor(&cli, "x1", &["--concurrency", "4", "--block-timeout", "30s", "--exec", &exec]);
    std::thread::sleep(Duration::from_millis(300));
    cli.ok(&["dispatch", "--kind", "rec", "--shards", "6", "--task-id", "ex"]);
    // a full window is waited out by the time the claim returned: with a 30 s block timeout and
    // no other wake-up, a poll or a missed due time would take 30 s
    cli.ok(&["wait", "ex", "--timeout", "10s"]);
    let t = sorted_starts(&rec, "ex");
    assert_eq!(t.len(), 6);
    assert_at_most_per_window(&t, 2, 300);
    assert!(t[5] - t[0] < 800 + 700, "3 windows of 400 ms took {} ms: {t:?}", t[5] - t[0]);
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------------------------------
// retention

#[test]
fn keep_results_false_drops_per_shard_results_but_keeps_the_aggregate() {
    let cli = Cli::start("keep");
    let _e = executor(&cli, "k1", &[]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "primes",
        "--shards",
        "4",
        "--items",
        "1000",
        "--task-id",
        "lean",
        "--keep-results",
        "false",
    ]);
    cli.ok(&["dispatch", "--kind", "primes", "--shards", "4", "--items", "1000", "--task-id", "full"]);
    cli.ok(&["wait", "lean", "--timeout", "20s"]);
    cli.ok(&["wait", "full", "--timeout", "20s"]);
    let mut con = cli.con();
    let lean: i64 = redis::cmd("EXISTS").arg(cli.key("task:lean:results")).query(&mut con).unwrap();
    let full: i64 = redis::cmd("HLEN").arg(cli.key("task:full:results")).query(&mut con).unwrap();
    assert_eq!((lean, full), (0, 4));
    for id in ["lean", "full"] {
        let s = status(&cli, id);
        assert_eq!(s["result"], serde_json::json!({"primes": 168}), "{s}");
    }
    // the default retention is 7 days, on every key the task has
    let ttl = pttl(&cli, "task:full");
    assert!(ttl > 6 * 24 * 3600 * 1000 && ttl <= 7 * 24 * 3600 * 1000, "{ttl}");
    assert!(pttl(&cli, "task:full:results") > 0 && pttl(&cli, "task:full:terminal") > 0);
    assert!(in_zset(&cli, "expiring", "full"));
}

#[test]
fn a_task_past_its_retention_is_removed_with_all_its_keys_and_forever_keeps_them() {
    let cli = Cli::start("retain");
    let _e = executor(&cli, "t1", &["--stalled-interval", "200ms"]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":0.5}"#,
        "--shards",
        "6",
        "--task-id",
        "brief",
        "--retain",
        "1s",
        "--attempts",
        "2",
        "--backoff",
        "fixed:10ms",
    ]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "kept", "--retain", "forever"]);
    let _ = cli.run(&["wait", "brief", "--timeout", "20s"]);
    cli.ok(&["wait", "kept", "--timeout", "20s"]);
    let ttl = pttl(&cli, "task:brief");
    assert!(ttl > 0 && ttl <= 2000, "{ttl}");
    assert!(in_zset(&cli, "expiring", "brief"));
    eventually("the brief task to be removed", Duration::from_secs(6), || {
        let gone = keys_of(&cli, "brief").is_empty()
            && !in_zset(&cli, "index", "brief")
            && !in_zset(&cli, "finished", "brief")
            && !in_zset(&cli, "expiring", "brief");
        gone.then_some(()).ok_or_else(|| format!("left: keys {:?}", keys_of(&cli, "brief")))
    });
    let st = cli.run(&["status", "brief"]);
    assert_ne!(st.code(), 0, "{st:?}");
    // forever: no TTL, not expiring, still there
    assert_eq!(pttl(&cli, "task:kept"), -1);
    assert!(!in_zset(&cli, "expiring", "kept") && in_zset(&cli, "index", "kept"));
    assert_eq!(status(&cli, "kept")["state"], "completed");
}

#[test]
fn clean_older_than_zero_removes_every_ended_task_and_leaves_running_ones() {
    let cli = Cli::start("clean");
    let mut e = executor(&cli, "c1", &[]);
    cli.ok(&["dispatch", "--kind", "primes", "--shards", "3", "--task-id", "ok1"]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":1.0}"#,
        "--shards",
        "2",
        "--task-id",
        "bad1",
        "--attempts",
        "1",
    ]);
    // a shard in its backoff (a retry 30 s away) when its task is cancelled
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":1.0}"#,
        "--shards",
        "2",
        "--task-id",
        "can1",
        "--attempts",
        "3",
        "--backoff",
        "fixed:30s",
    ]);
    cli.ok(&["wait", "ok1", "--timeout", "20s"]);
    assert_eq!(cli.run(&["wait", "bad1", "--timeout", "20s"]).code(), 3);
    let mut con = cli.con();
    eventually("2 retries delayed", Duration::from_secs(10), || {
        let n: i64 = redis::cmd("ZCARD").arg(cli.key("delayed")).query(&mut con).unwrap();
        (n == 2).then_some(()).ok_or(n)
    });
    // `fixed:30s` waits 30 s, not a jittered 15-30 s: each retry is due 30 s after its failure
    let due: Vec<(String, u64)> =
        redis::cmd("ZRANGE").arg(cli.key("delayed")).arg(0).arg(-1).arg("WITHSCORES").query(&mut con).unwrap();
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now = s * 1000 + us / 1000;
    for (r, at) in &due {
        let left = at.saturating_sub(now);
        assert!(left > 27_000 && left <= 30_000, "{r} is due in {left} ms: fixed:30s must wait 30 s");
    }
    e.terminate();
    cli.ok(&["cancel", "can1"]);
    let delayed: i64 = redis::cmd("ZCARD").arg(cli.key("delayed")).query(&mut con).unwrap();
    assert_eq!(delayed, 0, "the cancelled task's retries left `delayed`");
    // running (no executor left) and delayed tasks are not ended
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "run1"]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "del1", "--delay", "1h"]);
    let before_run = keys_of(&cli, "run1");
    let out = cli.ok(&["clean", "--older-than", "0s"]);
    assert!(out.contains("removed 3"), "{out}");
    for id in ["ok1", "bad1", "can1"] {
        assert_eq!(keys_of(&cli, id), Vec::<String>::new(), "keys of {id} left after clean");
        for set in ["index", "finished", "expiring", "running"] {
            assert!(!in_zset(&cli, set, id), "{id} left in {set}");
        }
    }
    assert_eq!(keys_of(&cli, "run1"), before_run);
    assert_eq!(status(&cli, "run1")["state"], "running");
    assert_eq!(status(&cli, "del1")["state"], "delayed");
    assert!(in_zset(&cli, "index", "run1") && in_zset(&cli, "index", "del1"));
    assert!(cli.ok(&["clean", "--older-than", "0s"]).contains("removed 0"));
    // the queued pull task still runs to its end afterwards
    let _e2 = executor(&cli, "c2", &[]);
    cli.ok(&["wait", "run1", "--timeout", "20s"]);
}

/// Issue 11, defect 1: the executor cached a task's spec by id alone, so a task id dispatched
/// again after cancel and clean ran with the old task's kind and size (shard 0 slept as the old
/// `sleep` task, shards 1–3 failed "outside the task") and `wait` never succeeded. Refs now carry
/// the task's incarnation and the cache is keyed by it.
#[test]
fn a_task_id_dispatched_again_runs_the_new_tasks_spec() {
    let cli = Cli::start("reused-id");
    let mut e = executor(&cli, "a", &["--lock-renew", "250ms"]);
    cli.ok(&["dispatch", "--task-id", "x", "--kind", "sleep", "--shards", "1", "--payload", r#"{"ms":600000}"#]);
    let mut con = cli.con();
    eventually("the sleep shard to start", Duration::from_secs(10), || {
        let held: Vec<String> = redis::cmd("HKEYS").arg(cli.key("active")).query(&mut con).unwrap();
        held.iter().any(|r| r.starts_with("x:")).then_some(()).ok_or(e.log())
    });
    cli.ok(&["cancel", "x"]);
    cli.ok(&["clean", "--older-than", "0s"]);
    cli.ok(&["dispatch", "--task-id", "x", "--kind", "noop", "--shards", "4", "--attempts", "1"]);
    let out = cli.run(&["wait", "x", "--timeout", "20s", "--json"]);
    let log = e.log();
    assert_eq!(out.code(), 0, "the new task under the id must complete: {out:?}\n{log}");
    let s = status(&cli, "x");
    assert_eq!(
        (s["state"].as_str(), s["done"].as_u64(), s["failed"].as_u64()),
        (Some("completed"), Some(4), Some(0)),
        "{s}"
    );
    assert!(!log.contains("outside the task"), "a shard ran with the old task's size: {log}");
    e.terminate();
}
