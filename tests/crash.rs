//! The crash test (README "Guarantees": no loss, counted once, one trigger): four real
//! `shardctl executor` processes run a `primes` task of 2,000 shards on a private redis-server
//! while the test SIGKILLs, SIGSTOPs
//! (past the lock) and SIGTERMs them at random moments. Then it checks that the prime count is
//! exact, that every shard was counted once and none failed, that the task was aggregated once,
//! and that nothing is left behind (no shard held in `active`, no shard state, nothing waiting).
//!
//! A third round dispatches the task with `--strategy consistent-hash` (ARCHITECTURE.md "Routing and rebalancing"): shards
//! wait on their owners' lists, a dead or frozen node's shards move to their new owners, and every
//! executor started to replace one joins the ring. Its executors beat their membership every
//! 200 ms and count as gone after 1 s, so that failover keeps pace with the schedule; it also
//! checks that nothing is left on the node lists, in `reroute` or unplaced.
//!
//! The schedule comes from a xorshift seeded from the clock. The seed is printed;
//! `SHARDCTL_CRASH_SEED=<seed> cargo test --test crash <test name> -- --nocapture` replays the
//! schedule (not the processes' own timing). A MONITOR connection watches the commands the
//! scripts run, so that "counted once" and "aggregated once" are checked on the writes
//! themselves, not only on the final counters.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;
// the crash test's own harness
mod chaos;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chaos::*;
use serde_json::{json, Value};
use shardctl_common::keys::ACTIVE_PIN;
use support::task_counts;

const SHARDS: u64 = 2000;
/// 200,000 items a shard: a shard takes a few tens of milliseconds in a debug build, so that
/// every disruption finds shards in flight, and the task outlasts the schedule on two cores.
const ITEMS: u64 = 400_000_000;
const EXECUTORS: usize = 4;
const DISRUPTIONS: usize = 10;
/// Fewer disruptions landing while shards remain means the task ran too fast to test anything.
const MIN_DISRUPTIONS: usize = 6;
const GRACE: Duration = Duration::from_secs(1);
/// Well past the lock (1 s): its lease expires while the process sleeps (1 s after its last beat,
/// at most 300 ms before the stop), and the sweep (run at the lease's expiry by whichever
/// executors live, maybe replacements still starting) hands its shards to others before it wakes,
/// so that its late work is refused. A lease that lapsed alone loses nothing: shards no sweep
/// recovered stay with their holder, whose heartbeat takes the lease again.
const STOP_MS: (u64, u64) = (3000, 4000);
const GAP_MS: (u64, u64) = (150, 600);

/// The rounds share two cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
/// π(4·10⁸), the known count (computing it in a debug build costs seconds of the two cores).
const EXPECTED: u64 = 21_336_326;

/// How a round dispatches its task and what its executors are told besides [`CHAOS_EXECUTOR_ARGS`].
struct Setup {
    /// The test function, for the replay hint.
    test: &'static str,
    /// `--strategy` of the dispatch; `None` leaves the default (pull).
    strategy: Option<&'static str>,
    extra_executor_args: &'static [&'static str],
    /// Run on a 3-master Redis Cluster instead of one redis-server.
    on_cluster: bool,
    /// Partitions of the queue (`config --partitions`; 1: not partitioned).
    partitions: u32,
}

/// The pull rounds: the default strategy and the executor arguments alone.
fn pull(test: &'static str) -> Setup {
    Setup { test, strategy: None, extra_executor_args: &[], on_cluster: false, partitions: 1 }
}

#[test]
fn crash_round_one() {
    crash_round(1, pull("crash_round_one"));
}

#[test]
fn crash_round_two() {
    crash_round(2, pull("crash_round_two"));
}

#[test]
fn crash_round_consistent_hash() {
    crash_round(
        4,
        Setup {
            test: "crash_round_consistent_hash",
            strategy: Some("consistent-hash"),
            extra_executor_args: &["--member-heartbeat", "200ms", "--member-timeout", "1s"],
            on_cluster: false,
            partitions: 1,
        },
    );
}

/// The same round, unchanged, on a Redis Cluster: the monitor and the final checks read the
/// master that owns the queue's slot.
#[test]
fn crash_round_on_a_cluster() {
    crash_round(5, Setup { on_cluster: true, ..pull("crash_round_on_a_cluster") });
}

/// The round over 3 partitions of one redis-server (ARCHITECTURE.md "Partitioned queues"):
/// the shares run, report and are counted in the home once, whatever is killed where.
#[test]
fn crash_round_over_partitions() {
    crash_round(6, Setup { partitions: 3, ..pull("crash_round_over_partitions") });
}

/// The consistent-hash round over 3 partitions of one server: every partition's node lists,
/// placed over the home's membership, fail over and rebalance like the queue's.
#[test]
fn crash_round_consistent_hash_over_partitions() {
    crash_round(
        8,
        Setup {
            test: "crash_round_consistent_hash_over_partitions",
            strategy: Some("consistent-hash"),
            extra_executor_args: &["--member-heartbeat", "200ms", "--member-timeout", "1s"],
            on_cluster: false,
            partitions: 3,
        },
    );
}

/// The same over 3 partitions on a 3-master cluster: one partition per master.
#[test]
fn crash_round_over_partitions_on_a_cluster() {
    crash_round(7, Setup { partitions: 3, on_cluster: true, ..pull("crash_round_over_partitions_on_a_cluster") });
}

/// What every partition of a partitioned round holds at the end: a connection to its master
/// and its prefix.
fn partition_spaces(c: &Fleet) -> Vec<(redis::Connection, String)> {
    let out = c.cli(&["config", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("config --json prints JSON");
    v["partition_tags"]
        .as_array()
        .expect("partition_tags")
        .iter()
        .map(|t| {
            let tag = t.as_str().unwrap().to_owned();
            let con = match &c.redis {
                Server::Single(r) => r.con(),
                Server::Cluster(cl) => cl.node_con(cl.owner(cl.keyslot(&format!("{{{tag}}}")))),
            };
            (con, format!("{{{tag}}}:"))
        })
        .collect()
}

fn crash_round(round: u32, setup: Setup) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed(round);
    eprintln!(
        "crash round {round}: seed {seed} (replay: SHARDCTL_CRASH_SEED={seed} cargo test --test crash {})",
        setup.test
    );
    let mut rng = XorShift::new(seed);
    let expected = EXPECTED;

    let mut c = Fleet::new(round, setup.on_cluster);
    c.extra_executor_args = setup.extra_executor_args;
    let mut con = c.redis.con(&c.queue);
    let task = format!("primes-{round}");
    let prefix = format!("{{shardctl:{}}}:", c.queue);
    let tkey = format!("{prefix}task:{task}");
    let watch = monitor(c.redis.port(&c.queue), &prefix, &task);

    if setup.partitions > 1 {
        let out = c.cli(&["config", "--partitions", &setup.partitions.to_string()]);
        assert!(out.status.success(), "config: {}", String::from_utf8_lossy(&out.stderr));
    }
    for _ in 0..EXECUTORS {
        c.spawn();
    }
    let start = Instant::now();
    let (shards, items) = (SHARDS.to_string(), ITEMS.to_string());
    let mut dispatch = vec![
        "dispatch",
        "--shards",
        &shards,
        "--items",
        &items,
        "--kind",
        "primes",
        "--task-id",
        &task,
        "--attempts",
        "100",
        "--backoff",
        "fixed:100ms",
        "--json",
    ];
    if let Some(s) = setup.strategy {
        dispatch.extend(["--strategy", s]);
    }
    let out = c.cli(&dispatch);
    assert!(out.status.success(), "dispatch failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("dispatch --json prints JSON");
    assert_eq!(v["task_id"], json!(task));

    // the first three disruptions are one of each kind, in a random order; then any kind
    let mut kinds = [Disruption::Kill, Disruption::Stop, Disruption::Term];
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut done_by: BTreeMap<&str, usize> = BTreeMap::new();
    let name = |k| match k {
        Disruption::Kill => "SIGKILL",
        Disruption::Stop => "SIGSTOP",
        Disruption::Term => "SIGTERM",
    };
    let mut landed = 0;
    for n in 0..DISRUPTIONS {
        let gap = rng.ms(GAP_MS);
        c.pause(gap);
        let (state, done): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(&tkey).arg("state").arg("done").query(&mut con).unwrap();
        if state.as_deref() != Some("running") {
            eprintln!("  task {} after {:.1}s: no more disruptions", state.unwrap_or_default(), secs(start));
            break;
        }
        let kind = kinds.get(n).copied().unwrap_or_else(|| match rng.below(10) {
            0..=3 => Disruption::Kill,
            4..=6 => Disruption::Stop,
            _ => Disruption::Term,
        });
        let (kind, what) = c.disrupt(kind, &mut rng);
        *done_by.entry(name(kind)).or_default() += 1;
        landed += 1;
        eprintln!("  +{:.1}s #{} {what}; {}/{SHARDS} shards done", secs(start), n + 1, done.unwrap_or(0));
    }
    // continue every stopped executor: its late work must be refused, its handlers cancelled
    while c.execs.iter().any(|e| e.stopped_until.is_some()) {
        c.pause(Duration::from_millis(20));
    }

    let out = c.cli(&["wait", &task, "--timeout", "120s", "--json"]);
    let took = secs(start);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("  task ended after {took:.1}s: {}", stdout.trim());
    assert_eq!(out.status.code(), Some(0), "wait: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    let t: Value = serde_json::from_str(&stdout).expect("wait --json prints JSON");

    // nothing may remain: idle executors drop stale refs within a block timeout, and no shard is
    // held in `active` (only its pin may be: whatever lease outlives its executor holds nothing)
    let deadline = Instant::now() + Duration::from_secs(3);
    let leftovers = loop {
        // per-shard state left: the fields of the task's `:shards` hash
        let shards: Vec<String> =
            redis::cmd("HKEYS").arg(format!("{prefix}task:{task}:shards")).query(&mut con).unwrap();
        let (held, wait, delayed): (BTreeMap<String, String>, Vec<String>, u64) = redis::pipe()
            .cmd("HGETALL")
            .arg(format!("{prefix}active"))
            .cmd("LRANGE")
            .arg(format!("{prefix}wait"))
            .arg(0)
            .arg(-1)
            .cmd("ZCARD")
            .arg(format!("{prefix}delayed"))
            .query(&mut con)
            .unwrap();
        let held: Vec<String> =
            held.into_iter().filter(|(r, _)| r != ACTIVE_PIN).map(|(r, t)| format!("{r} held by {t}")).collect();
        let active = held.len() as u64;
        let left = (held, shards, active, wait, delayed);
        if (left.0.is_empty() && left.1.is_empty() && left.2 == 0 && left.3.is_empty() && left.4 == 0)
            || Instant::now() > deadline
        {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // a routed task also leaves nothing on the node lists, in `reroute` or unplaced
    // (on one server: a partitioned queue's partitions are on it too)
    let spaces: Vec<String> = if setup.partitions > 1 && !setup.on_cluster {
        partition_spaces(&c).into_iter().map(|(_, p)| p).chain([prefix.clone()]).collect()
    } else {
        vec![prefix.clone()]
    };
    let routed_left = setup.strategy.map(|_| {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let mut refs: Vec<String> = Vec::new();
            let mut unrouted: Vec<String> = Vec::new();
            for space in &spaces {
                for list in
                    scan(&mut con, &format!("{space}node:*:wait")).into_iter().chain([format!("{space}reroute")])
                {
                    let l: Vec<String> = redis::cmd("LRANGE").arg(&list).arg(0).arg(-1).query(&mut con).unwrap();
                    refs.extend(l.into_iter().map(|r| format!("{list}: {r}")));
                }
                let u: Vec<String> =
                    redis::cmd("ZRANGE").arg(format!("{space}unrouted")).arg(0).arg(-1).query(&mut con).unwrap();
                unrouted.extend(u);
            }
            if (refs.is_empty() && unrouted.is_empty()) || Instant::now() > deadline {
                break (refs, unrouted);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    // a partitioned task's shards are counted in its shares, and nothing is left in them either
    let mut share_left = Vec::new();
    let (bits, results, errors) = if setup.partitions > 1 {
        let mut sum = (0, 0, 0);
        let spaces = partition_spaces(&c);
        assert_eq!(spaces.len() as u32, setup.partitions);
        for (mut pcon, pprefix) in spaces {
            let (b, r, e) = task_counts(&mut pcon, &format!("{pprefix}task:{task}"));
            sum = (sum.0 + b, sum.1 + r, sum.2 + e);
            let (held, wait, delayed, unreported, state): (BTreeMap<String, String>, u64, u64, u64, String) =
                redis::pipe()
                    .cmd("HGETALL")
                    .arg(format!("{pprefix}active"))
                    .cmd("LLEN")
                    .arg(format!("{pprefix}wait"))
                    .cmd("ZCARD")
                    .arg(format!("{pprefix}delayed"))
                    .cmd("ZCARD")
                    .arg(format!("{pprefix}unreported"))
                    .cmd("HGET")
                    .arg(format!("{pprefix}task:{task}"))
                    .arg("state")
                    .query(&mut pcon)
                    .unwrap();
            let held = held.keys().filter(|r| *r != ACTIVE_PIN).count();
            if held + wait as usize + delayed as usize + unreported as usize > 0
                || !matches!(state.as_str(), "aggregating" | "completed")
            {
                share_left.push(format!(
                    "{pprefix}: {held} held, {wait} waiting, {delayed} delayed, {unreported} unreported, share {state}"
                ));
            }
        }
        sum
    } else {
        task_counts(&mut con, &tkey)
    };
    let state: String = redis::cmd("HGET").arg(&tkey).arg("state").query(&mut con).unwrap();

    c.stop_all();
    let _: String = redis::cmd("ECHO").arg(MONITOR_END).query(&mut con).unwrap();
    let seen = watch.join().expect("monitor thread");

    // figures
    let mut all_logs = String::new();
    let mut late = 0;
    let mut late_known = false;
    let mut spurious = 0;
    let count = |text: &str, needle: &str| text.lines().filter(|l| l.contains(needle)).count() as u64;
    for e in &c.execs {
        let text = strip_ansi(&e.proc.log());
        let st = ExecStats::parse(&text);
        let fate = match (e.signalled, e.was_stopped) {
            (Some((Disruption::Kill, _)), false) => "SIGKILLed",
            (Some((Disruption::Kill, _)), true) => "SIGSTOPped, SIGKILLed",
            (Some(_), true) => "SIGSTOPped, SIGTERMed",
            (Some(_), false) => "SIGTERMed",
            (None, _) => "exited on its own",
        };
        let (lost, refused) = (count(&text, "lock lost"), count(&text, "outcome refused"));
        match st {
            Some(st) => {
                // claims it did not finish itself: dropped when found lost, or refused
                let abandoned = st.abandoned();
                spurious += st.locks_lost.saturating_sub(abandoned);
                if e.was_stopped {
                    late += abandoned;
                    late_known = true;
                }
                eprintln!(
                    "    {}: {fate}; claimed {}, finished {}, abandoned {abandoned} ({lost} locks lost, {refused} \
                     outcomes refused), aggregated {}",
                    e.node,
                    st.claimed,
                    st.claimed - abandoned,
                    st.aggregated
                );
            }
            None => eprintln!("    {}: {fate}; {lost} locks lost, {refused} outcomes refused", e.node),
        }
        all_logs.push_str(&text);
    }
    let recovered = sum_field(&all_logs, "stalled sweep", "recovered");
    let lost = count(&all_logs, "lock lost");
    let refused = count(&all_logs, "outcome refused");
    let aggregated = sum_field(&all_logs, "executor stopped", "aggregated");
    eprintln!(
        "  round {round}: {landed} disruptions {done_by:?}, {} executor processes, task {took:.1}s, round {:.1}s",
        c.execs.len(),
        secs(start)
    );
    eprintln!(
        "  sweep recovered {recovered} shards ({} stall recoveries seen), {lost} locks reported lost ({spurious} of \
         them for shards the executor finished itself: see the regression test below), {refused} outcomes refused, {late} \
         claims abandoned by SIGSTOPped executors, {} releases, {} failed attempts",
        seen.stall_recoveries, seen.releases, seen.failed_attempts
    );
    eprintln!("  monitor: {seen:?}; aggregated by gracefully stopped executors: {aggregated}");

    // the right answer, every shard done, none failed
    assert_eq!(t["state"], json!("completed"), "{t}");
    assert_eq!(t["result"], json!({ "primes": expected }), "{t}");
    assert_eq!(t["total"], json!(SHARDS), "{t}");
    assert_eq!(t["done"], json!(SHARDS), "{t}");
    assert_eq!(t["failed"], json!(0), "{t}");
    assert!(t["finished_ms"].is_u64(), "{t}");
    // counted once: the bitmap, the counters and the writes agree
    assert_eq!(bits, SHARDS, "terminal bitmap");
    assert_eq!(results, SHARDS, "one stored result per shard");
    assert_eq!(errors, 0, "no failure reason left");
    assert_eq!(state, "completed");
    // on a partitioned queue the home's `done` is raised once per share, by the shares' counts
    assert_eq!(seen.done_incr, SHARDS, "`done` raised once per shard: {seen:?}");
    if setup.partitions == 1 {
        assert_eq!(seen.setbit, SHARDS, "each shard finished once: {seen:?}");
    }
    assert!(share_left.is_empty(), "left in the partitions: {share_left:?}");
    assert_eq!(seen.failed_incr, 0, "{seen:?}");
    // aggregated once
    assert_eq!(seen.trigger, 1, "aggregation triggered once: {seen:?}");
    assert_eq!(seen.result_set, 1, "result recorded once: {seen:?}");
    assert_eq!((seen.completed, seen.failed_state), (1, 0), "task finished once: {seen:?}");
    assert!(seen.agg_lpush >= 1 && seen.agg_claims >= 1, "{seen:?}");
    assert!(aggregated <= 1, "{aggregated} executors report an aggregation");
    // nothing left behind
    let (held, shards, active, wait, delayed) = leftovers;
    assert!(held.is_empty(), "shards left held: {held:?}");
    assert!(shards.is_empty(), "shard state left: {shards:?}");
    assert_eq!(active, 0, "shards left active");
    assert!(wait.is_empty(), "refs left waiting: {wait:?}");
    assert_eq!(delayed, 0, "shards left delayed");
    if let Some(s) = setup.strategy {
        assert_eq!(t["strategy"], json!(s), "{t}");
        assert_eq!(t["routed"], json!(SHARDS), "{t}");
        let (refs, unrouted) = routed_left.expect("checked for routed rounds");
        assert!(refs.is_empty(), "refs left on node lists or in reroute: {refs:?}");
        assert!(unrouted.is_empty(), "task left unplaced: {unrouted:?}");
    }
    // the processes behaved
    assert!(c.unexpected_exits.is_empty(), "{:?}", c.unexpected_exits);
    for e in &c.execs {
        if let Some((Disruption::Term, at)) = e.signalled {
            let Some((st, when)) = e.exit else { panic!("{} did not exit within 11s of SIGTERM", e.node) };
            assert!(st.success(), "{} exited with {st} after SIGTERM", e.node);
            assert!(when - at < GRACE + Duration::from_secs(10), "{} took {:?} to stop", e.node, when - at);
        }
    }
    // a frozen executor may hold nothing at the instant it is stopped, so this is a figure of the
    // pull rounds (busier executors) only; lost-lock handling has deterministic tests of its own
    // (common/tests/invariants.rs, tests/runtime.rs)
    if late_known && setup.strategy.is_none() {
        assert!(late > 0, "no SIGSTOPped executor had late work refused or its handlers cancelled");
    }
    assert!(landed >= MIN_DISRUPTIONS, "only {landed} disruptions landed before the task ended: raise ITEMS");
}

/// Regression test for a bug the crash test showed: one executor, nothing disrupted, and yet
/// some of its locks were reported lost ("lock lost: cancelling its handler", `locks_lost`).
// The heartbeat once counted the locks that the reporter's own completions had just deleted.
#[test]
fn completed_shards_are_not_reported_as_lost_locks() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Fleet::new(3, false);
    let node = "quiet-0".to_owned();
    let mut cmd = c.command();
    cmd.args(["executor", "--node-id", &node, "--concurrency", "8", "--lock-duration", "1s"])
        // a heartbeat every 20 ms widens the window; the lock is still 50 renewals long
        .args(["--lock-renew", "20ms", "--block-timeout", "200ms"]);
    let i = c.add(node, cmd);
    let log = c.execs[i].proc.log_path().to_owned();
    let out = c.cli(&["dispatch", "--shards", "20000", "--kind", "noop", "--task-id", "quiet", "--json"]);
    assert!(out.status.success(), "dispatch failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = c.cli(&["wait", "quiet", "--timeout", "60s", "--json"]);
    assert_eq!(out.status.code(), Some(0), "wait: {}", String::from_utf8_lossy(&out.stdout));
    c.stop_all();
    assert!(c.unexpected_exits.is_empty(), "{:?}", c.unexpected_exits);
    let text = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    let st = ExecStats::parse(&text).expect("the executor logs its counters when it stops");
    eprintln!("undisturbed executor: {st:?}");
    assert_eq!((st.claimed, st.completed, st.aggregated), (20_001, 20_000, 1), "{st:?}");
    let lost_lines = text.lines().filter(|l| l.contains("lock lost")).count();
    assert_eq!(
        (st.locks_lost, lost_lines),
        (0, 0),
        "an undisturbed executor that finished every shard it claimed reported locks lost: {st:?}"
    );
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
