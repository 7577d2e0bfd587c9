//! Fair sharing, weights, groups and caps (docs/design/fairness.md) with real executor
//! processes: a small task dispatched behind a big one of the same priority starts within a
//! claim round instead of waiting for all of it (it took 44 times its time alone); two tasks of
//! weights 1 and 3 hold slots near 1:3; a group of ten tasks holds no more than a lone task; a
//! `--max-running 3` task never runs more than 3 shards, by `active` and by its handler's own
//! log, also when an executor holding some is SIGKILLed. The exact figures are the bench's
//! (`shardctl bench --only fairness`); here generous ratios.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::Cli;

/// From dispatch to the end, by the task's own record (the server's clock).
fn took_ms(t: &serde_json::Value) -> u64 {
    t["finished_ms"].as_u64().unwrap() - t["created_ms"].as_u64().unwrap()
}

/// Shards of each task held in `active` now.
fn held_per_task(cli: &Cli) -> HashMap<String, u64> {
    let refs: Vec<String> = redis::cmd("HKEYS").arg(cli.key("active")).query(&mut cli.con()).unwrap();
    let mut per = HashMap::new();
    for r in refs.iter().filter(|r| !r.starts_with('~') && !r.ends_with(":agg")) {
        *per.entry(r.split(':').next().unwrap().to_owned()).or_insert(0) += 1;
    }
    per
}

/// Samples `held_per_task` every 20 ms for `d`: the sums per task.
fn sample(cli: &Cli, d: Duration) -> HashMap<String, u64> {
    let mut sums = HashMap::new();
    let end = Instant::now() + d;
    while Instant::now() < end {
        for (t, n) in held_per_task(cli) {
            *sums.entry(t).or_insert(0) += n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    sums
}

#[test]
fn a_small_task_behind_a_big_one_starts_within_one_claim_round() {
    let cli = Cli::start("fair-small-behind-big");
    let _a = cli.executor("fa", &["--concurrency", "8"]);
    let _b = cli.executor("fb", &["--concurrency", "8"]);
    let sleep = r#"{"ms":50}"#;
    let small = |id: &str| {
        let args = ["dispatch", "--kind", "sleep", "--payload", sleep, "--shards", "16", "--task-id", id];
        cli.json(&[&args[..], &["--wait", "--json"]].concat(), 0)
    };
    // warm (both executors up and claiming), then the small task alone, three times
    small("warm");
    let median = |mut v: Vec<u64>| {
        v.sort();
        v[v.len() / 2]
    };
    let alone_ms = median((0..3).map(|i| took_ms(&small(&format!("alone-{i}")))).collect());
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", sleep, "--shards", "3200", "--task-id", "big"]);
    std::thread::sleep(Duration::from_secs(1));
    let behind_ms = median((0..3).map(|i| took_ms(&small(&format!("behind-{i}")))).collect());
    let big = cli.json(&["status", "big", "--json"], 0);
    assert!(big["done"].as_u64().unwrap() < 3200, "the big task ended before the small ones: {big}");
    eprintln!("small task alone: {alone_ms} ms; behind a 3,200-shard task: {behind_ms} ms (medians of 3)");
    // it waited for the whole big task before (9.5 s, 44 times its time alone). Now it gets
    // the slots as they free; no scheduler that lets running shards end can spare it the wait
    // for 16 of them to free, one shard length (50 ms) when the big task's shards end at
    // random, so the bound is twice its time alone plus that wait
    assert!(
        behind_ms <= 2 * alone_ms + 50,
        "behind the big task the small one took {behind_ms} ms, alone {alone_ms} ms"
    );
    let big = cli.json(&["wait", "big", "--timeout", "120s", "--json"], 0);
    assert_eq!((big["done"].as_u64(), big["failed"].as_u64()), (Some(3200), Some(0)), "{big}");
    assert_eq!(big["result"]["completed"], 3200, "{big}");
}

#[test]
fn weights_share_slots_in_proportion_and_a_group_of_ten_holds_as_much_as_one_task() {
    let cli = Cli::start("fair-weights");
    let _a = cli.executor("wa", &["--concurrency", "8"]);
    let _b = cli.executor("wb", &["--concurrency", "8"]);
    let sleep = r#"{"ms":100}"#;
    let dispatch = |id: &str, extra: &[&str]| {
        let args = ["dispatch", "--kind", "sleep", "--payload", sleep, "--shards", "2000", "--task-id", id];
        cli.ok(&[&args[..], extra].concat());
    };
    dispatch("one", &[]);
    dispatch("three", &["--weight", "3"]);
    std::thread::sleep(Duration::from_millis(500));
    let s = sample(&cli, Duration::from_secs(3));
    let ratio = s["three"] as f64 / s["one"] as f64;
    eprintln!("held, summed over samples: {s:?}; ratio {ratio:.2}");
    assert!((2.2..=4.0).contains(&ratio), "weights 3:1 held {ratio:.2}:1 ({s:?})");
    cli.ok(&["cancel", "one"]);
    cli.ok(&["cancel", "three"]);

    for i in 0..10 {
        dispatch(&format!("team-{i}"), &["--group", "team"]);
    }
    dispatch("alone", &[]);
    std::thread::sleep(Duration::from_millis(500));
    let s = sample(&cli, Duration::from_secs(3));
    let team: u64 = s.iter().filter(|(t, _)| t.starts_with("team-")).map(|(_, n)| n).sum();
    let ratio = team as f64 / s["alone"] as f64;
    eprintln!("group of ten against one task: {team} against {}: {ratio:.2}", s["alone"]);
    assert!((0.6..=1.6).contains(&ratio), "a group of ten held {ratio:.2} times a lone task ({s:?})");
}

#[test]
fn a_cap_holds_by_active_and_by_the_handlers_log_also_through_a_sigkill() {
    let cli = Cli::start("fair-cap");
    let log = std::env::temp_dir().join(format!("shardctl-fair-cap-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // each attempt logs its start and end (ns since the epoch) in a file of its own
    let exec = format!(
        "sh -c 'echo s $SHARDCTL_SHARD_INDEX $(date +%s%N) >> {0}; sleep 0.2; echo e $SHARDCTL_SHARD_INDEX $(date +%s%N) >> {0}'",
        log.display()
    );
    let mut a = cli.executor("ca", &["--concurrency", "4", "--exec", &exec]);
    let _b = cli.executor("cb", &["--concurrency", "4", "--exec", &exec]);
    cli.ok(&["dispatch", "--kind", "x", "--shards", "40", "--task-id", "capped", "--max-running", "3"]);
    let mut most = 0;
    let start = Instant::now();
    let mut killed_at = None;
    let (mut said_capped, mut shown_sharing) = (false, false);
    while start.elapsed() < Duration::from_secs(60) {
        most = most.max(held_per_task(&cli).get("capped").copied().unwrap_or(0));
        if killed_at.is_none() && start.elapsed() > Duration::from_millis(1200) {
            a.kill();
            killed_at = Some(std::time::SystemTime::now());
        }
        let t = cli.json(&["status", "capped", "--json"], 0);
        if t["state"] == "completed" {
            break;
        }
        // status says what holds it back, and what it holds
        assert!(t["running"].as_u64().is_some_and(|n| n <= 3), "{t}");
        said_capped |=
            t["stuck"].as_array().unwrap().iter().any(|s| s.as_str().unwrap().starts_with("capped: 3 of 3 running"));
        if !shown_sharing {
            let text = cli.ok(&["status", "capped"]);
            shown_sharing = text.contains("sharing: ") && text.contains("max-running 3");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(said_capped, "status never said the task was held back by its cap");
    assert!(shown_sharing, "status never showed how the task shares the executors");
    let t = cli.json(&["wait", "capped", "--timeout", "30s", "--json"], 0);
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(40), Some(0)), "{t}");
    assert!(most <= 3, "{most} shards held at once under a cap of 3");
    assert_eq!(most, 3, "the cap was never reached: the test shows nothing");

    // the handlers' own log: at no instant more than 3 ran (an attempt the SIGKILL cut short
    // ends with its executor: its handler is killed with it)
    let killed = killed_at.unwrap().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128;
    let text = std::fs::read_to_string(&log).unwrap();
    let mut open: HashMap<String, Vec<i128>> = HashMap::new();
    let mut edges = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (what, idx, at) = (f[0], f[1].to_owned(), f[2].parse::<i128>().unwrap());
        if what == "s" {
            open.entry(idx).or_default().push(at);
            edges.push((at, 1));
        } else {
            open.get_mut(&idx).and_then(|v| v.pop()).expect("an end without a start");
            edges.push((at, -1));
        }
    }
    for starts in open.values() {
        for &s in starts {
            assert!(s < killed, "an attempt started after the kill never ended");
            edges.push((killed + 500_000_000, -1));
        }
    }
    edges.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    assert!(peak <= 3, "the handlers' log shows {peak} attempts at once under a cap of 3");
    let _ = std::fs::remove_file(&log);
}
