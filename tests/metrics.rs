//! Observability end to end (issue 4): the Prometheus endpoints of a real `shardctl executor` and
//! `shardctl coordinator` scraped over plain HTTP after a known run, every metric asserted with
//! its value; both scrapes checked by `promtool check metrics` where it is installed; a finished
//! task's label set leaving the coordinator's output after its retention; the event log in order.
//! Nothing here asserts an elapsed time: waits poll for a state under a hang guard.

#[allow(dead_code)] // shared with tests/cli.rs, which uses all of it
mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Cli, Process};

/// How long a state may take to show before the test calls it hung (a guard, not a timing).
const GUARD: Duration = Duration::from_secs(30);

/// Fails attempt 1 of shards 0..10 with exit status 3; every other attempt prints 1.
const FLAKY: &str = r#"sh -c '[ "$SHARDCTL_ATTEMPT" = 1 ] && [ "$SHARDCTL_SHARD_INDEX" -lt 10 ] && exit 3; echo 1'"#;

fn free_addr() -> String {
    shardctl_testkit::free_addr()
}

/// `GET /metrics` over a plain TcpStream; the body, or `None` while nothing answers.
fn get_metrics(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    // HTTP/1.0: the server closes the connection after the response, no chunking
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    assert!(status.contains(" 200"), "GET /metrics on {addr}: {head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain"), "GET /metrics on {addr}: {head}");
    Some(body.to_owned())
}

/// One scrape, parsed: (name, labels) → value.
struct Scrape {
    text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    fn parse(text: String) -> Self {
        let mut samples = Vec::new();
        for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels in {line:?}"));
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line:?}"));
                            (k.to_owned(), v.trim_end_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
            };
            samples.push((name, labels, value));
        }
        Scrape { text, samples }
    }

    /// The samples of `name` whose labels include `labels`.
    fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = f64> + 'a {
        self.samples
            .iter()
            .filter(move |(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, v)| *v)
    }

    /// The one sample of `name` with `labels`; panics unless there is exactly one.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let v: Vec<f64> = self.matching(name, labels).collect();
        assert_eq!(v.len(), 1, "{name}{labels:?}: {} samples in\n{}", v.len(), self.text);
        v[0]
    }

    /// The sample of `name` with `labels`, if any.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next()
    }

    /// Whether any sample carries label `key` = `value`.
    fn has_label(&self, key: &str, value: &str) -> bool {
        self.samples.iter().any(|(_, l, _)| l.get(key).map(String::as_str) == Some(value))
    }

    /// `# TYPE` of `name`.
    fn kind(&self, name: &str) -> Option<&str> {
        self.text.lines().find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
    }
}

/// Scrapes `addr` until `ok` holds for a scrape, which it returns.
fn scrape_until(addr: &str, what: &str, procs: &[&Process], ok: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + GUARD;
    let mut last = None;
    loop {
        if let Some(text) = get_metrics(addr) {
            let s = Scrape::parse(text);
            if ok(&s) {
                return s;
            }
            last = Some(s.text);
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs.iter().map(|p| p.log()).collect();
            panic!(
                "{addr}: {what} never showed; last scrape:\n{}\nlogs:\n{}",
                last.unwrap_or_default(),
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `promtool check metrics` on a scrape, or says why it is skipped (a failure in CI).
fn promtool_check(what: &str, text: &str) {
    if !shardctl_testkit::tool_available("promtool", &["--version"], "`promtool check metrics`") {
        return;
    }
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!("promtool did not start: {e}"),
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the {what} scrape ({:?}):\n{}{}\n--- scrape\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The executor's counters that a clean run leaves at zero, besides those asserted otherwise.
const CLASSES: [&str; 8] = ["panic", "exit", "no_handler", "too_large", "payload", "cancelled", "timeout", "error"];

#[test]
fn metrics_of_a_known_run_on_executor_and_coordinator() {
    let cli = Cli::start("metrics");
    let (eaddr, caddr) = (free_addr(), free_addr());
    let mut e = cli.executor("m1", &["--exec", FLAKY, "--metrics-addr", &eaddr]);
    let mut c = cli.background(
        "coordinator",
        &["coordinator", "--metrics-addr", &caddr, "--refresh", "200ms", "--finished-retention", "1s"],
    );
    let procs = [&e, &c];
    let q = cli.queue.as_str();
    let en = [("queue", q), ("node", "m1")];
    let qn = [("queue", q)];

    // --- 1. 100 shards, 0..10 failing once: the coordinator shows the task while it is retained
    cli.ok(&[
        "dispatch",
        "--kind",
        "sh",
        "--shards",
        "100",
        "--attempts",
        "3",
        "--backoff",
        "fixed:10ms",
        "--task-id",
        "known",
    ]);
    let task = [("queue", q), ("task", "known"), ("kind", "sh")];
    let s = scrape_until(&caddr, "task known at 100 done", &procs, |s| {
        s.get("shardctl_task_shards_done", &task) == Some(100.0)
    });
    assert_eq!(s.value("shardctl_task_shards", &task), 100.0);
    assert_eq!(s.value("shardctl_task_shards_failed", &task), 0.0);
    assert_eq!(s.value("shardctl_task_progress_ratio", &task), 1.0);
    for m in ["shardctl_task_shards", "shardctl_task_shards_done", "shardctl_task_progress_ratio"] {
        assert_eq!(s.kind(m), Some("gauge"), "{m}");
    }
    assert_eq!(cli.run(&["wait", "known"]).code(), 0);
    let finished_ms = cli.json(&["status", "known", "--json"], 0)["finished_ms"].as_u64().expect("finished_ms");

    // the executor: every ref claimed has ended; the aggregation job is claimed like a shard
    // (111 = 100 first attempts + 10 retries + 1 aggregation) and counted apart from shards;
    // shards claimed ahead and given back unstarted (when the running ones went quiet on this
    // loaded machine) are claimed again and counted as released
    let s = scrape_until(&eaddr, "every claim recorded", &procs, |s| {
        let released = s.get("shardctl_shards_released_total", &en).unwrap_or(0.0);
        s.get("shardctl_shards_claimed_total", &en) == Some(111.0 + released)
            && s.get("shardctl_shards_in_flight", &en) == Some(0.0)
    });
    assert_eq!(s.value("shardctl_shards_completed_total", &en), 100.0);
    assert_eq!(s.value("shardctl_shards_retried_total", &en), 10.0);
    for class in CLASSES {
        assert_eq!(s.value("shardctl_shards_failed_total", &[("queue", q), ("node", "m1"), ("class", class)]), 0.0);
    }
    assert_eq!(s.value("shardctl_aggregations_total", &[("queue", q), ("node", "m1"), ("outcome", "completed")]), 1.0);
    assert_eq!(s.value("shardctl_aggregations_total", &[("queue", q), ("node", "m1"), ("outcome", "failed")]), 0.0);
    assert_eq!(s.value("shardctl_locks_lost_total", &en), 0.0);
    assert_eq!(s.value("shardctl_redis_reconnects_total", &en), 0.0);
    assert_eq!(s.value("shardctl_stalled_recovered_total", &qn), 0.0);
    assert_eq!(s.value("shardctl_stalled_failed_total", &qn), 0.0);
    // 110 shard attempts ran (the aggregation is not a shard run)
    assert_eq!(s.kind("shardctl_shard_run_seconds"), Some("histogram"));
    assert_eq!(s.value("shardctl_shard_run_seconds_count", &en), 110.0);
    assert_eq!(s.value("shardctl_shard_run_seconds_bucket", &[("queue", q), ("node", "m1"), ("le", "+Inf")]), 110.0);
    assert!(s.value("shardctl_shard_run_seconds_sum", &en) > 0.0);
    // every claim call is timed: at least one, at most one per ref (claims ahead take several)
    assert_eq!(s.kind("shardctl_claim_seconds"), Some("histogram"));
    let claims = s.value("shardctl_claim_seconds_count", &en);
    assert!((1.0..=111.0).contains(&claims), "{claims} claim calls for 111 refs");
    assert!(s.value("shardctl_claim_seconds_sum", &en) > 0.0);
    for (name, kind) in [
        ("shardctl_shards_claimed_total", "counter"),
        ("shardctl_shards_failed_total", "counter"),
        ("shardctl_shards_in_flight", "gauge"),
        ("shardctl_lock_heartbeats_total", "counter"),
    ] {
        assert_eq!(s.kind(name), Some(kind), "{name}");
    }

    // the coordinator: the queue is empty, one executor is live, no task failed
    let s = scrape_until(&caddr, "an empty queue", &procs, |s| {
        s.get("shardctl_queue_waiting", &qn) == Some(0.0)
            && s.get("shardctl_queue_active", &qn) == Some(0.0)
            && s.get("shardctl_queue_running_tasks", &qn) == Some(0.0)
    });
    assert_eq!(s.value("shardctl_queue_delayed", &qn), 0.0);
    assert_eq!(s.value("shardctl_queue_failed_tasks", &qn), 0.0);
    assert_eq!(s.value("shardctl_executors_live", &qn), 1.0);
    assert_eq!(s.value("shardctl_stalled_recovered_total", &qn), 0.0);
    assert_eq!(s.value("shardctl_stalled_failed_total", &qn), 0.0);

    // after its retention (1 s) the task's label set leaves the output
    let gone = scrape_until(&caddr, "task known gone", &procs, |s| !s.has_label("task", "known"));
    let since_end = shardctl_common::time::now_ms().saturating_sub(finished_ms);
    assert!(since_end >= 1000, "task known left the metrics {since_end} ms after it ended, before its retention");
    assert!(gone.get("shardctl_queue_waiting", &qn).is_some(), "the queue gauges stay:\n{}", gone.text);

    // --- 2. a shard failing for good, and a shard held across heartbeats
    cli.ok(&["dispatch", "--kind", "sh", "--shards", "1", "--attempts", "1", "--task-id", "doomed"]);
    assert_eq!(cli.run(&["wait", "doomed"]).code(), 3);
    let doomed = [("queue", q), ("task", "doomed"), ("kind", "sh")];
    let s =
        scrape_until(&caddr, "task doomed failed", &procs, |s| s.get("shardctl_queue_failed_tasks", &qn) == Some(1.0));
    assert_eq!(s.value("shardctl_task_shards", &doomed), 1.0);
    assert_eq!(s.value("shardctl_task_shards_done", &doomed), 0.0);
    assert_eq!(s.value("shardctl_task_shards_failed", &doomed), 1.0);
    assert_eq!(s.value("shardctl_task_progress_ratio", &doomed), 1.0);

    cli.ok(&["dispatch", "--kind", "sleep", "--shards", "1", "--payload", r#"{"ms":3500}"#, "--task-id", "sleepy"]);
    let s = scrape_until(&eaddr, "the sleeping shard in flight", &procs, |s| {
        s.get("shardctl_shards_in_flight", &en) == Some(1.0)
    });
    let beats_before = s.value("shardctl_lock_heartbeats_total", &en);
    let sleepy = [("queue", q), ("task", "sleepy"), ("kind", "sleep")];
    let s = scrape_until(&caddr, "task sleepy running", &procs, |s| s.get("shardctl_queue_active", &qn) == Some(1.0));
    assert_eq!(s.value("shardctl_task_shards", &sleepy), 1.0);
    assert_eq!(s.value("shardctl_task_progress_ratio", &sleepy), 0.0);
    assert_eq!(s.value("shardctl_queue_running_tasks", &qn), 1.0);
    let coordinator_scrape = s.text;
    assert_eq!(cli.run(&["wait", "sleepy"]).code(), 0);

    let s = scrape_until(&eaddr, "every claim recorded again", &procs, |s| {
        s.get("shardctl_shards_claimed_total", &en) == Some(115.0)
            && s.get("shardctl_shards_in_flight", &en) == Some(0.0)
    });
    assert_eq!(s.value("shardctl_shards_completed_total", &en), 101.0);
    assert_eq!(s.value("shardctl_shards_retried_total", &en), 10.0);
    for class in CLASSES {
        let want = if class == "exit" { 1.0 } else { 0.0 };
        let got = s.value("shardctl_shards_failed_total", &[("queue", q), ("node", "m1"), ("class", class)]);
        assert_eq!(got, want, "failed class {class}");
    }
    // the aggregation of a task with a failed shard completes (the task ends failed)
    assert_eq!(s.value("shardctl_aggregations_total", &[("queue", q), ("node", "m1"), ("outcome", "completed")]), 3.0);
    assert_eq!(s.value("shardctl_aggregations_total", &[("queue", q), ("node", "m1"), ("outcome", "failed")]), 0.0);
    assert_eq!(s.value("shardctl_shard_run_seconds_count", &en), 112.0);
    // the 3.5 s shard was held across heartbeats every second: each kept it alive
    let beats = s.value("shardctl_lock_heartbeats_total", &en);
    let extended = s.value("shardctl_locks_extended_total", &en);
    assert!(beats >= beats_before + 2.0, "{beats} heartbeats, {beats_before} when the shard started");
    assert!(extended >= 2.0, "{extended} locks extended in {beats} heartbeats");
    assert_eq!(s.value("shardctl_locks_lost_total", &en), 0.0);
    assert_eq!(s.value("shardctl_shards_released_total", &en), 0.0);
    assert_eq!(s.value("shardctl_redis_reconnects_total", &en), 0.0);
    let executor_scrape = s.text;

    // the failed task leaves the metrics too, and with it the failed count
    scrape_until(&caddr, "task doomed gone", &procs, |s| {
        !s.has_label("task", "doomed") && s.get("shardctl_queue_failed_tasks", &qn) == Some(0.0)
    });

    promtool_check("executor", &executor_scrape);
    promtool_check("coordinator", &coordinator_scrape);

    assert_eq!(e.terminate().code(), Some(0), "executor: {}", e.log());
    assert_eq!(c.terminate().code(), Some(0), "coordinator: {}", c.log());
}

/// Per group (docs/design/fairness.md): the shards its tasks hold and those still to hand out.
#[test]
fn group_gauges_show_what_a_group_holds_and_what_waits() {
    let cli = Cli::start("group-gauges");
    let caddr = free_addr();
    let e = cli.executor("g1", &["--concurrency", "4"]);
    let c = cli.background("coordinator", &["coordinator", "--metrics-addr", &caddr, "--refresh", "200ms"]);
    for id in ["team-a", "team-b"] {
        let args = ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":300}"#, "--shards", "40", "--group", "team"];
        cli.ok(&[&args[..], &["--task-id", id]].concat());
    }
    let g = [("queue", cli.queue.as_str()), ("group", "team")];
    let s = scrape_until(&caddr, "the group's gauges", &[&e, &c], |s| {
        s.get("shardctl_group_running", &g).is_some_and(|n| n >= 1.0)
            && s.get("shardctl_group_waiting", &g).is_some_and(|n| n > 0.0)
    });
    assert!(s.value("shardctl_group_running", &g) <= 4.0, "{}", s.text);
    assert!(s.value("shardctl_group_waiting", &g) <= 80.0, "{}", s.text);
    promtool_check("coordinator with groups", &s.text);
    for id in ["team-a", "team-b"] {
        cli.ok(&["cancel", id]);
    }
}

#[test]
fn redis_outage_counts_reconnects() {
    let mut cli = Cli::start("reconnects");
    let addr = free_addr();
    let e = cli.executor("r1", &["--metrics-addr", &addr, "--lock-renew", "200ms"]);
    let en = [("queue", cli.queue.as_str()), ("node", "r1")];
    scrape_until(&addr, "a heartbeat", &[&e], |s| s.get("shardctl_lock_heartbeats_total", &en) >= Some(1.0));
    cli.redis.stop();
    scrape_until(&addr, "a failed Redis call", &[&e], |s| s.get("shardctl_redis_reconnects_total", &en) >= Some(1.0));
    cli.redis.restart();
    let before = get_metrics(&addr).map(Scrape::parse).expect("scrape");
    let beats = before.value("shardctl_lock_heartbeats_total", &en);
    // it beats again once Redis is back
    scrape_until(&addr, "heartbeats after the restart", &[&e], |s| {
        s.get("shardctl_lock_heartbeats_total", &en) > Some(beats)
    });
}

#[test]
fn coordinator_refuses_a_busy_metrics_address_and_bad_settings() {
    let cli = Cli::start("busy-addr");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = cli.run(&["coordinator", "--metrics-addr", &addr]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains(&format!("cannot serve metrics on {addr}")), "{out:?}");
    let out = cli.run(&["coordinator", "--metrics-addr", &free_addr(), "--refresh", "1ms"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("refresh (1ms) must be at least 10ms"), "{out:?}");
    let out = cli.run(&["executor", "--metrics-addr", "nowhere"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("--metrics-addr"), "{out:?}");
}

// The coordinator and an executor run on one host with the documented flags: the coordinator's
// default is loopback on its own port, and `off` turns its listener off.
#[test]
fn coordinator_metrics_default_to_loopback_on_their_own_port_and_can_be_off() {
    let cli = Cli::start("coord-defaults");
    let help = cli.ok(&["coordinator", "--help"]);
    assert!(help.contains("127.0.0.1:9465"), "{help}");
    let out = cli.run(&["coordinator", "--metrics-addr", "nowhere"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("or off"), "{out:?}");
    let mut c = cli.background("coord", &["coordinator", "--metrics-addr", "off", "--log", "info"]);
    support::eventually("the coordinator to start", Duration::from_secs(30), || {
        let log = c.log();
        if let Some(st) = c.ended() {
            panic!("the coordinator ended ({st}):\n{log}");
        }
        log.contains("coordinator started").then_some(()).ok_or(log)
    });
    assert!(!c.log().contains("metrics on"), "no listener with off: {}", c.log());
    assert!(c.terminate().success(), "{}", c.log());
}

fn watch(cli: &Cli, task: &str, count: usize) -> Vec<Value> {
    let out = cli.ok(&["watch", "--from-start", "--count", &count.to_string(), "--json", "--task", task]);
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}"))).collect()
}

/// The task's events straight from the stream (to know nothing follows what `watch` printed).
fn stream_events(cli: &Cli, task: &str) -> Vec<String> {
    let entries: Vec<(String, Vec<String>)> =
        redis::cmd("XRANGE").arg(cli.key("events")).arg("-").arg("+").query(&mut cli.con()).expect("XRANGE");
    entries
        .into_iter()
        .filter_map(|(_, kv)| {
            let m: BTreeMap<&str, &str> = kv.chunks(2).map(|p| (p[0].as_str(), p[1].as_str())).collect();
            (m.get("task") == Some(&task)).then(|| m["event"].to_owned())
        })
        .collect()
}

#[test]
fn event_log_holds_a_runs_events_in_order() {
    let cli = Cli::start("events");
    // shard 1 fails its first attempt
    let flaky = r#"sh -c '[ "$SHARDCTL_ATTEMPT" = 1 ] && [ "$SHARDCTL_SHARD_INDEX" = 1 ] && exit 3; echo 1'"#;
    let _e = cli.executor("ev1", &["--exec", flaky]);
    cli.ok(&["dispatch", "--kind", "sh", "--shards", "3", "--backoff", "fixed:10ms", "--task-id", "ev", "--wait"]);

    let events = watch(&cli, "ev", 4);
    let names: Vec<&str> = events.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(names, ["task_dispatched", "shard_retried", "task_aggregating", "task_completed"], "{events:?}");
    assert_eq!((events[0]["kind"].as_str(), events[0]["total"].as_u64()), (Some("sh"), Some(3)), "{events:?}");
    let retried = &events[1];
    assert_eq!((retried["shard"].as_u64(), retried["attempt"].as_u64()), (Some(1), Some(1)), "{retried}");
    assert!(retried["reason"].as_str().unwrap().starts_with("handler exited with status 3"), "{retried}");
    assert_eq!((events[2]["done"].as_u64(), events[2]["failed"].as_u64()), (Some(3), Some(0)), "{events:?}");
    assert!(events.iter().all(|e| e["task"] == "ev" && e["time_ms"].as_u64().is_some()), "{events:?}");
    let times: Vec<u64> = events.iter().map(|e| e["time_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // and nothing else: per-shard completions are off by default
    assert_eq!(stream_events(&cli, "ev"), names);

    // turned on, every completed shard adds an event before the aggregation
    cli.ok(&["config", "--events-completions", "on"]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "ev2", "--wait"]);
    let names: Vec<String> = watch(&cli, "ev2", 5).iter().map(|e| e["event"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, ["task_dispatched", "shard_completed", "shard_completed", "task_aggregating", "task_completed"]);
    assert_eq!(stream_events(&cli, "ev2"), names);
}
