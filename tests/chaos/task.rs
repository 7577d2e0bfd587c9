//! One task of a crash round: dispatched, disrupted (executors SIGKILLed, SIGSTOPped past their
//! lock and SIGTERMed; on a cluster with replicas, a master SIGKILLed mid-run and its replica
//! promoted), waited for and checked: the exact result, every shard counted once, one
//! aggregation, nothing left held, waiting or unreported in the home or in any partition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shardctl_common::keys::ACTIVE_PIN;

use super::{failover::*, monitor, scan, Disruption, Fleet, Server, XorShift, MONITOR_END};
use crate::support::task_counts;
use crate::{DISRUPTIONS, EXPECTED, GAP_MS, ITEMS, MIN_DISRUPTIONS, SHARDS};

/// One task of a round.
pub(crate) struct Plan {
    pub(crate) id: String,
    /// `--strategy` of the dispatch; `None` leaves the default (pull).
    pub(crate) strategy: Option<&'static str>,
    /// The queue's partition count when the task is dispatched (1: not partitioned).
    pub(crate) partitions: u32,
    pub(crate) kill_master: Option<Master>,
    /// A count that `config --partitions` is asked for while the task runs: it must be refused.
    pub(crate) refuse_partitions: Option<u32>,
    /// The round's last task: every executor is stopped before the monitor ends.
    pub(crate) last: bool,
}

/// What a task's run leaves for the round's figures.
#[derive(Default)]
pub(crate) struct Run {
    pub(crate) landed: usize,
    pub(crate) done_by: BTreeMap<&'static str, usize>,
}

/// A task's share in one partition: a connection to its master, the partition's prefix, its slot.
pub(crate) struct Share {
    pub(crate) con: redis::Connection,
    pub(crate) prefix: String,
    pub(crate) slot: u16,
}

/// The task's shares (none for a task of one partition), from the tags its home record holds
/// (a later change of the count leaves them readable), each on its master as of now.
pub(crate) fn shares(c: &Fleet, con: &mut redis::Connection, tkey: &str) -> Vec<Share> {
    let tags: Option<String> = redis::cmd("HGET").arg(tkey).arg("partition_tags").query(con).unwrap();
    let tags = tags.unwrap_or_default();
    tags.split_whitespace()
        .map(|tag| {
            let key = format!("{{{tag}}}");
            let (con, slot) = match &c.redis {
                Server::Single(r) => (r.con(), 0),
                Server::Cluster(cl) => {
                    let slot = cl.keyslot(&key);
                    (cl.node_con(cl.owner(slot)), slot)
                }
            };
            Share { con, prefix: format!("{key}:"), slot }
        })
        .collect()
}

pub(crate) fn run_task(c: &mut Fleet, plan: &Plan, rng: &mut XorShift, start: Instant) -> Run {
    let task = plan.id.as_str();
    let prefix = format!("{{shardctl:{}}}:", c.queue);
    let tkey = format!("{prefix}task:{task}");
    let mut con = c.redis.con(&c.queue);
    let watch = monitor(c.redis.port(&c.queue), &prefix, task);
    let (shards, items) = (SHARDS.to_string(), ITEMS.to_string());
    let mut dispatch = vec!["dispatch", "--shards", &shards, "--items", &items, "--kind", "primes", "--task-id", task];
    dispatch.extend(["--attempts", "100", "--backoff", "fixed:100ms", "--json"]);
    if let Some(s) = plan.strategy {
        dispatch.extend(["--strategy", s]);
    }
    let out = c.cli(&dispatch);
    assert!(out.status.success(), "dispatch failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("dispatch --json prints JSON");
    assert_eq!(v["task_id"], json!(task));
    let mut parts = shares(c, &mut con, &tkey);
    assert_eq!(parts.len() as u32, if plan.partitions > 1 { plan.partitions } else { 0 }, "the task's shares");
    if let Some(k) = plan.refuse_partitions {
        refused_while_running(c, task, plan.partitions, k);
    }
    let mut kill = plan.kill_master.map(|m| Kill::choose(c, m, &parts, rng));

    // the first three disruptions are one of each kind, in a random order; then any kind
    let mut kinds = [Disruption::Kill, Disruption::Stop, Disruption::Term];
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut run = Run::default();
    let name = |k| match k {
        Disruption::Kill => "SIGKILL",
        Disruption::Stop => "SIGSTOP",
        Disruption::Term => "SIGTERM",
    };
    for n in 0..DISRUPTIONS {
        let gap = rng.ms(GAP_MS);
        c.pause(gap);
        if let Some(k) = &mut kill {
            k.follow(c, start, &mut con, &mut parts, &tkey);
        }
        // the home's state is unknown while its master is down: the task runs
        // (or while any master is: the cluster is down until a replica takes over)
        if !kill.as_ref().is_some_and(|k| k.master == Master::Home && k.down()) {
            let state = redis::cmd("HGET").arg(&tkey).arg("state").query::<Option<String>>(&mut con);
            let state = state.unwrap_or_else(|e| {
                assert!(kill.as_ref().is_some_and(Kill::down), "reading {tkey}: {e}");
                Some("running".to_owned())
            });
            if state.as_deref() != Some("running") {
                eprintln!("  task {} after {:.1}s: no more disruptions", state.unwrap_or_default(), secs(start));
                break;
            }
        }
        if let Some(k) = &mut kill {
            k.strike_when_due(c, start, &mut con, &mut parts, &tkey);
        }
        let kind = kinds.get(n).copied().unwrap_or_else(|| match rng.below(10) {
            0..=3 => Disruption::Kill,
            4..=6 => Disruption::Stop,
            _ => Disruption::Term,
        });
        let (kind, what) = c.disrupt(kind, rng);
        *run.done_by.entry(name(kind)).or_default() += 1;
        run.landed += 1;
        let done = progress(&mut con, &tkey, &mut parts).map_or("?".to_owned(), |(d, _)| d.to_string());
        eprintln!("  +{:.1}s #{} {what}; {done}/{SHARDS} shards done", secs(start), n + 1);
    }
    // a master kill the schedule did not reach, and its failover: before the task ends
    let home_killed = kill.as_ref().is_some_and(|k| k.master == Master::Home);
    if let Some(k) = &mut kill {
        k.finish(c, start, &mut con, &mut parts, &tkey);
    }
    // continue every stopped executor: its late work must be refused, its handlers cancelled
    while c.execs.iter().any(|e| e.stopped_until.is_some()) {
        c.pause(Duration::from_millis(20));
    }

    let out = c.cli_ticking(&["wait", task, "--timeout", "120s", "--json"]);
    let took = secs(start);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("  task {task} ended after {took:.1}s: {}", stdout.trim());
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
        let left = (held, shards, wait, delayed);
        if (left.0.is_empty() && left.1.is_empty() && left.2.is_empty() && left.3 == 0) || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // a routed task also leaves nothing on the node lists, in `reroute` or unplaced, in the home
    // or in any partition
    let routed_left = plan.strategy.map(|_| {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let mut refs: Vec<String> = Vec::new();
            let mut unrouted: Vec<String> = Vec::new();
            let spaces = parts.iter_mut().map(|s| (&mut s.con, s.prefix.as_str())).chain([(&mut con, &*prefix)]);
            for (con, space) in spaces {
                for list in scan(con, &format!("{space}node:*:wait")).into_iter().chain([format!("{space}reroute")]) {
                    let l: Vec<String> = redis::cmd("LRANGE").arg(&list).arg(0).arg(-1).query(con).unwrap();
                    refs.extend(l.into_iter().map(|r| format!("{list}: {r}")));
                }
                let u: Vec<String> =
                    redis::cmd("ZRANGE").arg(format!("{space}unrouted")).arg(0).arg(-1).query(con).unwrap();
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
    let (bits, results, errors) = if parts.is_empty() {
        task_counts(&mut con, &tkey)
    } else {
        let mut sum = (0, 0, 0);
        for Share { con: pcon, prefix: pprefix, .. } in &mut parts {
            let (b, r, e) = task_counts(pcon, &format!("{pprefix}task:{task}"));
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
                    .query(pcon)
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
    };
    let state: String = redis::cmd("HGET").arg(&tkey).arg("state").query(&mut con).unwrap();
    // what survived in the home, whatever its master lost: its event log
    let logged = kill.as_ref().map(|_| Logged::read(&mut con, &prefix, task));

    if plan.last {
        c.stop_all();
    }
    let _: String = redis::cmd("ECHO").arg(MONITOR_END).query(&mut con).unwrap();
    let seen = watch.join().expect("monitor thread");
    eprintln!("  monitor{}: {seen:?}", if home_killed { " (until the home's master died)" } else { "" });
    if let Some(l) = &logged {
        eprintln!("  the home's event log: {l:?}");
    }

    // the right answer, every shard done, none failed
    assert_eq!(t["state"], json!("completed"), "{t}");
    assert_eq!(t["result"], json!({ "primes": EXPECTED }), "{t}");
    assert_eq!(t["total"], json!(SHARDS), "{t}");
    assert_eq!(t["done"], json!(SHARDS), "{t}");
    assert_eq!(t["failed"], json!(0), "{t}");
    assert!(t["finished_ms"].is_u64(), "{t}");
    // counted once: the bitmap, the counters and the writes agree
    assert_eq!(bits, SHARDS, "terminal bitmap");
    assert_eq!(results, SHARDS, "one stored result per shard");
    assert_eq!(errors, 0, "no failure reason left");
    assert_eq!(state, "completed");
    assert!(share_left.is_empty(), "left in the partitions: {share_left:?}");
    // MONITOR sees every write of the home's master; when that master died, the writes it had
    // not replicated are gone with it and the event log of the promoted replica tells what stayed
    if !home_killed {
        // on a partitioned queue the home's `done` is raised once per share, by the shares'
        // counts; a share that lost completions in a failover after it was counted is uncounted
        // (its count subtracted) and counted again
        assert_eq!(seen.done_incr, SHARDS as i64, "`done` raised once per shard: {seen:?}");
        if kill.is_none() {
            assert_eq!(seen.uncounts, 0, "a share uncounted with no write lost: {seen:?}");
        }
        if plan.partitions == 1 {
            assert_eq!(seen.setbit, SHARDS, "each shard finished once: {seen:?}");
        }
        assert_eq!(seen.failed_incr, 0, "{seen:?}");
        // aggregated once (an uncount withdraws the aggregation job: triggered again)
        assert!((1..=1 + seen.uncounts).contains(&seen.trigger), "aggregation triggered once: {seen:?}");
        assert_eq!(seen.result_set, 1, "result recorded once: {seen:?}");
        assert_eq!((seen.completed, seen.failed_state), (1, 0), "task finished once: {seen:?}");
        assert!(seen.agg_lpush >= 1 && seen.agg_claims >= 1, "{seen:?}");
    }
    if let Some(l) = logged {
        l.check(parts.len() as u64);
    }
    // nothing left behind
    let (held, shards, wait, delayed) = leftovers;
    assert!(held.is_empty(), "shards left held: {held:?}");
    assert!(shards.is_empty(), "shard state left: {shards:?}");
    assert!(wait.is_empty(), "refs left waiting: {wait:?}");
    assert_eq!(delayed, 0, "shards left delayed");
    if let Some(s) = plan.strategy {
        assert_eq!(t["strategy"], json!(s), "{t}");
        assert_eq!(t["routed"], json!(SHARDS), "{t}");
        let (refs, unrouted) = routed_left.expect("checked for routed rounds");
        assert!(refs.is_empty(), "refs left on node lists or in reroute: {refs:?}");
        assert!(unrouted.is_empty(), "task left unplaced: {unrouted:?}");
    }
    assert!(run.landed >= MIN_DISRUPTIONS, "only {} disruptions landed before the task ended: raise ITEMS", run.landed);
    run
}

/// `config --partitions k` while the task over `now` partitions runs: refused, saying why, and
/// the layout unchanged.
fn refused_while_running(c: &Fleet, task: &str, now: u32, k: u32) {
    let before = c.cli(&["config", "--json"]);
    let out = c.cli(&["config", "--partitions", &k.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "config --partitions {k} while {task} runs: {stderr}");
    let why = format!("task '{task}' runs over {now} partitions: wait for it (or cancel it) before changing the count");
    assert!(stderr.contains(&why), "config --partitions {k} while {task} runs: {stderr}");
    let after = c.cli(&["config", "--json"]);
    assert_eq!(String::from_utf8_lossy(&after.stdout), String::from_utf8_lossy(&before.stdout), "refused, yet changed");
    eprintln!("  config --partitions {k} while {task} runs: refused ({})", stderr.trim());
}

/// The task's progress: the home's counts, or while it runs over partitions its shares' summed
/// (`None` while a master it reads is down).
pub(crate) fn progress(con: &mut redis::Connection, tkey: &str, parts: &mut [Share]) -> Option<(u64, u64)> {
    if parts.is_empty() {
        let (d, t): (Option<u64>, Option<u64>) =
            redis::cmd("HMGET").arg(tkey).arg("done").arg("total").query(con).ok()?;
        return Some((d.unwrap_or(0), t.unwrap_or(0)));
    }
    let task = tkey.rsplit_once(":task:").map(|(_, t)| t).expect("a task key");
    let mut sum = (0, 0);
    for s in parts {
        let (d, t) = share_progress(s, task)?;
        sum = (sum.0 + d, sum.1 + t);
    }
    Some(sum)
}

/// One share's done and total (`None` while its master is down).
pub(crate) fn share_progress(s: &mut Share, task: &str) -> Option<(u64, u64)> {
    let (d, t): (Option<u64>, Option<u64>) =
        redis::cmd("HMGET").arg(format!("{}task:{task}", s.prefix)).arg("done").arg("total").query(&mut s.con).ok()?;
    Some((d.unwrap_or(0), t.unwrap_or(0)))
}

pub(crate) fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
