//! Backup attempts for stragglers (docs/design/speculation.md) through the binary: four
//! executor processes, one of which runs every shard 400× slower (the built-in `sleep` kind's
//! `"slow_node"`); with `--speculate` the task ends long before that node's shards would, every
//! shard counted once; SIGKILLing the slow node while its shards have backups loses nothing.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::Cli;

/// 50 ms a shard; 20 s on node `slow`.
const PAYLOAD: &str = r#"{"ms":50,"slow_node":"slow","slow_factor":400}"#;

/// Task `id` of `shards` shards with `--speculate`, waited for: it completed, every shard once,
/// long before the slow node's shards (20 s each) would have ended. Its `status --json`.
fn past_the_slow_node(cli: &Cli, id: &str, shards: u64) -> serde_json::Value {
    let n = shards.to_string();
    let started = Instant::now();
    let args = ["dispatch", "--kind", "sleep", "--payload", PAYLOAD, "--shards", &n, "--speculate", "--task-id", id];
    let t = cli.json(&[&args[..], &["--wait", "--timeout", "60s", "--json"][..]].concat(), 0);
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(shards), Some(0))
    );
    t
}

/// The sum over `addrs`' `/metrics` of the series `name` (all its label sets).
fn metric_sum(addrs: &[String], name: &str) -> f64 {
    let mut sum = 0.0;
    for addr in addrs {
        let body = support::eventually(&format!("metrics on {addr}"), Duration::from_secs(30), || {
            let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
            use std::io::{Read, Write};
            s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
                .map_err(|e| e.to_string())?;
            let mut buf = String::new();
            s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
            buf.contains("shardctl_").then_some(buf).ok_or_else(|| "no series yet".to_owned())
        });
        for l in body.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])) {
            sum += l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        }
    }
    sum
}

#[test]
fn backups_end_a_task_whose_node_straggles_and_every_shard_counts_once() {
    let cli = Cli::start("spec");
    // (before any executor runs: a refusal writes nothing, which the check compares)
    cli.rejects(
        &[
            "dispatch",
            "--kind",
            "sleep",
            "--payload",
            PAYLOAD,
            "--shards",
            "8",
            "--strategy",
            "consistent-hash",
            "--speculate",
        ],
        2,
        "--speculate needs the pull strategy",
    );
    let addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", shardctl_testkit::free_port())).collect();
    let _fast: Vec<_> = (0..3)
        .map(|i| cli.executor(&format!("fast{i}"), &["--concurrency", "4", "--metrics-addr", &addrs[i]]))
        .collect();
    let _slow = cli.executor("slow", &["--concurrency", "4"]);
    let t = past_the_slow_node(&cli, "s", 200);
    let (backups, won) = (t["spec_started"].as_u64().unwrap(), t["spec_won"].as_u64().unwrap());
    assert!(backups >= 1 && won >= 1 && won <= backups && backups <= 20, "{t}");
    assert_eq!(t["speculate"].as_u64(), Some(20), "10% of 200 by default");
    assert_eq!(cli.events("shard_speculated").len() as u64, backups);
    // (a first attempt given back unstarted leaves its backup the shard's only attempt: no race)
    let ended = cli.events("speculation_won").len() as u64;
    assert!(ended >= won && ended <= backups, "{ended} races ended, {won} won by a backup, {backups} backups");
    // the executors' metrics say the same: every backup ran on a fast node (the slow one holds
    // the first attempts), and the losers' time is measured once their stop reaches them
    assert_eq!(metric_sum(&addrs, "shardctl_backups_started_total") as u64, backups);
    assert_eq!(metric_sum(&addrs, "shardctl_backups_won_total") as u64, won);
    let status = cli.ok(&["status", "s"]);
    assert!(status.contains(&format!("speculation: {backups} backup(s) of at most 20, {won} won")), "{status}");
}

#[test]
fn a_straggling_node_killed_while_its_shards_have_backups_loses_nothing() {
    let cli = Cli::start("spec-kill");
    let _fast: Vec<_> = (0..2).map(|i| cli.executor(&format!("fast{i}"), &["--concurrency", "4"])).collect();
    let mut slow = cli.executor("slow", &["--concurrency", "4"]);
    let args = [
        "dispatch",
        "--kind",
        "sleep",
        "--payload",
        PAYLOAD,
        "--shards",
        "120",
        "--speculate",
        "50%",
        "--task-id",
        "k",
    ];
    cli.ok(&args);
    // once backups run, the slow node dies with its first attempts
    support::eventually("a backup started", Duration::from_secs(20), || {
        (!cli.events("shard_speculated").is_empty()).then_some(()).ok_or("none yet")
    });
    slow.kill();
    let t = cli.json(&["wait", "k", "--timeout", "60s", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(120), Some(0))
    );
    assert!(t["spec_started"].as_u64().unwrap() >= 1, "{t}");
}

#[test]
fn over_partitions_each_share_speculates_on_its_own() {
    let cli = Cli::start("spec-parts");
    cli.json(&["config", "--partitions", "3", "--json"], 0);
    let _fast: Vec<_> = (0..3).map(|i| cli.executor(&format!("fast{i}"), &["--concurrency", "4"])).collect();
    let _slow = cli.executor("slow", &["--concurrency", "4"]);
    let t = past_the_slow_node(&cli, "p", 150);
    // counted over the shares, each with its part of the cap (15 over 3 shares)
    let (backups, won) = (t["spec_started"].as_u64().unwrap(), t["spec_won"].as_u64().unwrap());
    assert!(backups >= 1 && won <= backups && backups <= 15, "{t}");
    assert_eq!(t["speculate"].as_u64(), Some(15));
}
