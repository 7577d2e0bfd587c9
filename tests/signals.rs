//! Signals as a Unix user expects them, through the binary with real processes: the first
//! SIGINT or SIGTERM says what the process waits for, a second one stops it at once (executor,
//! coordinator; `shardctl lock`'s are in tests/lock.rs); a waiter stops at once and says that
//! the task goes on; a tail (`watch`) just ends.

#[allow(dead_code)]
mod support;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use support::{eventually, Cli};

// The first SIGTERM says what the shutdown waits for; a second one stops at once, the shards
// still running given back (the grace here is a minute: without the second signal the executor
// would wait it out).
#[test]
fn a_second_signal_stops_an_executor_at_once() {
    let cli = Cli::start("two-signals");
    let mut e = cli.background("twice", &["--log", "info", "executor", "--node-id", "twice", "--grace", "60s"]);
    cli.ok(&["dispatch", "--kind", "sleep", "--payload", r#"{"ms":600000}"#, "--shards", "2", "--task-id", "long"]);
    let mut con = cli.con();
    eventually("both shards to run", Duration::from_secs(30), || {
        let n: u64 = redis::cmd("HLEN").arg(cli.key("active")).query(&mut con).unwrap();
        (n >= 3).then_some(()).ok_or(format!("{n} held\n{}", e.log())) // the two shards and the pin
    });
    e.signal("TERM");
    eventually("the first signal to be explained", Duration::from_secs(30), || {
        let log = e.log();
        (log.contains("running shards get up to 60s to finish")
            && log.contains("a second SIGINT or SIGTERM stops at once"))
        .then_some(())
        .ok_or(log)
    });
    assert!(e.ended().is_none(), "the executor stopped at the first signal:\n{}", e.log());
    e.signal("TERM");
    let st = e.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("still draining:\n{}", e.log()));
    assert!(st.success(), "{st}\n{}", e.log());
    let log = e.log();
    assert!(log.contains("again: stopping at once"), "{log}");
    let held: Vec<String> = redis::cmd("HKEYS").arg(cli.key("active")).query(&mut con).unwrap();
    assert!(held.iter().all(|r| !r.starts_with("long:")), "shards still held: {held:?}");
    let waiting: Vec<String> =
        redis::cmd("LRANGE").arg(cli.key("kind:sleep:wait")).arg(0).arg(-1).query(&mut con).unwrap();
    assert_eq!(waiting.len(), 2, "both shards given back at once: {waiting:?}");
}

// A wait stopped by a signal ends at once (exit 128 + the signal) and says that the task goes on
// without it, where it stands, and how to wait again or stop it. Before, the signal killed it
// silently, leaving a reader to guess whether the task was cancelled too.
#[test]
fn an_interrupted_wait_says_the_task_goes_on() {
    let cli = Cli::start("wait-signal");
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "idle"]);
    for (sig, code, args) in [
        ("INT", 130, vec!["wait", "idle"]),
        ("TERM", 143, vec!["dispatch", "--kind", "noop", "--shards", "2", "--task-id", "idle2", "--wait"]),
    ] {
        let mut w = cli.background("waiter", &args);
        // nothing runs the task: after 2 s the waiter says so, so it is surely waiting
        eventually("the waiter to explain the wait", Duration::from_secs(30), || {
            let log = w.log();
            log.contains("is not moving").then_some(()).ok_or(log)
        });
        w.signal(sig);
        let st = w.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("SIG{sig} did not stop the wait"));
        let log = w.log();
        assert_eq!((st.code(), st.signal()), (Some(code), None), "SIG{sig}: {log}");
        let id = args.iter().position(|a| *a == "--task-id").map_or("idle", |i| args[i + 1]);
        assert!(log.contains(&format!("SIG{sig}: stopped waiting; task {id} goes on (running: 0 of")), "{log}");
        assert!(log.contains(&format!("`shardctl wait {id}` waits again")), "{log}");
        // the task itself is untouched
        let t = cli.json(&["status", id, "--json"], 0);
        assert_eq!(t["state"], "running", "{t}");
    }
}

// The coordinator's first signal says what its stop waits for and that a second one stops at
// once; with Redis not answering (CLIENT PAUSE), the graceful stop would wait for it, and the
// second signal ends the process at once.
#[test]
fn a_coordinator_explains_its_stop_and_a_second_signal_ends_it() {
    let cli = Cli::start("coord-signal");
    let coordinator =
        |name| cli.background(name, &["--log", "info", "coordinator", "--metrics-addr", "off", "--refresh", "100ms"]);
    let announced = |c: &support::Process| {
        let mut con = cli.con();
        eventually("the coordinator to announce itself", Duration::from_secs(30), || {
            let n: u64 = redis::cmd("ZCARD").arg(cli.key("coordinators")).query(&mut con).unwrap();
            (n == 1).then_some(()).ok_or(c.log())
        });
    };

    // one signal: the stop is explained and ends by itself, the entry withdrawn
    let mut c = coordinator("coord1");
    announced(&c);
    c.signal("INT");
    let st = c.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| panic!("still stopping:\n{}", c.log()));
    let log = c.log();
    assert!(st.success(), "{st}\n{log}");
    assert!(log.contains("SIGINT: shutting down: the round of upkeep under way"), "{log}");
    assert!(log.contains("leaves the coordinators set; a second SIGINT or SIGTERM stops at once"), "{log}");
    assert!(log.contains("coordinator stopped"), "{log}");
    let n: u64 = redis::cmd("ZCARD").arg(cli.key("coordinators")).query(&mut cli.con()).unwrap();
    assert_eq!(n, 0, "a graceful stop withdraws the coordinator's entry");

    // Redis stops answering: the graceful stop cannot end; the second signal ends it
    let mut c = coordinator("coord2");
    announced(&c);
    // (it lapses by itself; the server goes with the test)
    let () = redis::cmd("CLIENT").arg("PAUSE").arg(60_000).arg("ALL").query(&mut cli.con()).unwrap();
    c.signal("TERM");
    eventually("the first signal to be explained", Duration::from_secs(30), || {
        let log = c.log();
        log.contains("SIGTERM: shutting down").then_some(()).ok_or(log)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(c.ended().is_none(), "the stop did not wait for Redis, the test proves nothing:\n{}", c.log());
    c.signal("TERM");
    let st =
        c.wait_exit(Duration::from_secs(8)).unwrap_or_else(|| panic!("a second SIGTERM did not end it:\n{}", c.log()));
    let log = c.log();
    assert!(st.success(), "{st}\n{log}");
    assert!(log.contains("SIGTERM again: stopping at once"), "{log}");
    assert!(log.contains("coordinator stopped at once: its entry in the coordinators set lapses within"), "{log}");
}

// `watch` is a tail: SIGINT or SIGTERM ends it at once, as the signal's default does.
#[test]
fn watch_ends_at_a_signal() {
    let cli = Cli::start("watch-signal");
    for sig in ["INT", "TERM"] {
        let mut w = cli.background("watcher", &["watch"]);
        cli.ok(&["dispatch", "--kind", "noop", "--shards", "1"]);
        std::thread::sleep(Duration::from_millis(300));
        w.signal(sig);
        let st = w.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("SIG{sig} did not end watch"));
        let num = if sig == "INT" { 2 } else { 15 };
        assert!(st.signal() == Some(num) || st.code() == Some(128 + num), "SIG{sig}: {st}\n{}", w.log());
    }
}
