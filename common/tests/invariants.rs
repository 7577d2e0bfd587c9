//! The invariants of README "Guarantees" that the Lua scripts carry, checked against a real
//! redis-server through the typed wrappers of `shardctl_common::scripts`. Each test has its own
//! server and queue; every time is the server's (the scripts read `TIME`), so delays are short
//! and real.
//!
//! Holding a shard: the `active` hash maps each held ref to the token of its claim call
//! (`<instance>:<seq>`), besides one permanent pin field that is no shard; the executor's lease
//! (its entry in `leases`, scored by its expiry) says its holder is alive. A lost lock is a ref
//! missing from `active` or held by another token; an expired lock is an expired lease.

mod support;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use shardctl_common::kinds::Served;
use shardctl_common::model::{ShardRef, TaskInfo, TaskSpec, TaskState};
use shardctl_common::scripts::{self, scripts, ClaimRequest, Claimed, Finished, FinishedAs, GiveBack, STALLED_REASON};
use shardctl_common::{Error, ScriptCode};
use support::{index, key_slot, ScriptEnv, ACTIVE_PIN, NODE};

/// A lease long enough never to expire during a test.
const LONG_LOCK: u64 = 60_000;

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::test]
async fn dispatch_of_a_million_shards_is_constant_in_keys() {
    let mut env = ScriptEnv::start("dispatch_million").await;
    let mut spec = TaskSpec::new("big", "noop", 1_000_000);
    spec.items = 10_000_000;
    spec.payload = r#"{"k":1}"#.into();
    spec.attempts = 5;
    spec.priority = 3;
    let before = shardctl_common::time::server_now_ms(&mut env.con, &env.keys).await.unwrap();
    env.dispatch(&spec).await;
    let after = shardctl_common::time::server_now_ms(&mut env.con, &env.keys).await.unwrap();

    let keys = env.all_keys().await;
    assert!(keys.len() < 10, "dispatching 1,000,000 shards created {} keys: {keys:?}", keys.len());
    assert_eq!(env.dbsize().await, keys.len() as u64);
    for key in &keys {
        let bytes: u64 = env.cmd(redis::cmd("MEMORY").arg("USAGE").arg(key)).await;
        // a stream allocates a whole node (stream-node-max-bytes, 4 KiB) for its first entry
        let limit = if *key == env.keys.events() { 8192 } else { 4096 };
        assert!(bytes < limit, "key {key} takes {bytes} bytes: per-shard data was stored at dispatch");
    }
    let events: u64 = env.cmd(redis::cmd("XLEN").arg(env.keys.events())).await;
    assert_eq!(events, 1, "the dispatch is one event, not one per shard");

    let t = env.task("big").await;
    let expected = [
        ("state", "running".to_owned()),
        ("cursor", "0".into()),
        ("done", "0".into()),
        ("failed", "0".into()),
        ("total", "1000000".into()),
        ("items", "10000000".into()),
        ("kind", "noop".into()),
        ("payload", r#"{"k":1}"#.into()),
        ("strategy", "pull".into()),
        ("attempts", "5".into()),
        ("priority", "3".into()),
        ("backoff", spec.backoff.to_string()),
    ];
    for (f, v) in &expected {
        assert_eq!(t.get(*f), Some(v), "task field {f} (whole hash: {t:?})");
    }
    let info = TaskInfo::from_hash("big", &t).expect("task hash parses").expect("task exists");
    assert_eq!((info.state, info.total, info.cursor), (TaskState::Running, 1_000_000, 0));
    assert!((before..=after).contains(&info.created_ms), "created at the server's time: {t:?}");
    let runnable: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.lane_tasks("noop")).arg(0).arg(-1)).await;
    assert_eq!(runnable, ["big"], "the task must be runnable");
    let created: Option<u64> = env.cmd(redis::cmd("ZSCORE").arg(env.keys.index()).arg("big")).await;
    assert_eq!(created, Some(info.created_ms), "the index must hold the task by creation time");

    // lazy shards: claiming k shards adds k fields to `active`, the task's count in `held`
    // (docs/design/fairness.md) and the executor's lease, no key per shard
    let before = env.all_keys().await;
    let out = env.claim("ex", 0, 7, LONG_LOCK).await;
    let idx: Vec<u64> = out.shards.iter().map(index).collect();
    assert_eq!(idx, (0..7).collect::<Vec<_>>(), "fresh shards come from the cursor in order");
    assert!(out.shards.iter().all(|c| c.attempt == 1 && c.fails == 0), "{:?}", out.shards);
    let after = env.all_keys().await;
    let added: Vec<&String> = after.iter().filter(|k| !before.contains(k)).collect();
    assert_eq!(
        added,
        [&env.keys.active(), &env.keys.held(), &env.keys.leases()],
        "claiming 7 shards must add `active`, `held` and the lease, nothing per shard: {after:?}"
    );
    assert_eq!(env.dbsize().await, before.len() as u64 + 3);
    assert_eq!(env.active().await.len(), 7, "the 7 shards are held in `active`");
    assert_eq!(env.count("big", "cursor").await, 7);
}

#[tokio::test]
async fn dispatch_of_an_existing_id_is_refused() {
    let mut env = ScriptEnv::start("dispatch_exists").await;
    env.dispatch(&TaskSpec::new("t", "noop", 10)).await;
    env.claim("ex", 0, 3, LONG_LOCK).await;

    let again = scripts::dispatch(&mut env.con, &env.keys, &TaskSpec::new("t", "primes", 99)).await;
    assert!(
        matches!(again, Err(Error::Script(ScriptCode::TaskExists))),
        "second dispatch of id t must fail with TaskExists, got {again:?}"
    );
    let t = env.task("t").await;
    assert_eq!(t.get("kind").map(String::as_str), Some("noop"), "the first task must be untouched: {t:?}");
    assert_eq!(t.get("total").map(String::as_str), Some("10"), "{t:?}");
    assert_eq!(t.get("cursor").map(String::as_str), Some("3"), "the refused dispatch reset the cursor: {t:?}");
    let seq: Option<u64> = env.cmd(redis::cmd("HGET").arg(env.keys.meta()).arg("seq")).await;
    assert_eq!(seq, Some(1), "a refused dispatch must not take a submission number");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_take_each_shard_exactly_once() {
    const SHARDS: usize = 2000;
    const CLAIMERS: usize = 16;
    const BATCH: usize = 7;
    let mut env = ScriptEnv::start("claim_exclusion").await;
    env.dispatch(&TaskSpec::new("t", "noop", SHARDS as u64)).await;

    let mut set = tokio::task::JoinSet::new();
    for w in 0..CLAIMERS {
        let mut con = env.manager().await;
        let keys = env.keys.clone();
        set.spawn(async move {
            let base = format!("exec-{w}");
            // one entry per claim call: its shards
            let (mut seq, mut got) = (0u64, Vec::new());
            loop {
                let req = ClaimRequest {
                    count: BATCH,
                    lock_ms: LONG_LOCK,
                    instance: &base,
                    seq,
                    node: "test-node",
                    ahead: 0,
                    speeds: None,
                    kinds: &Served::Every,
                };
                let out = scripts::claim(&mut con, &keys, &req).await.expect("claim");
                assert!(out.shards.len() <= BATCH, "claimer {w} got {} > {BATCH}", out.shards.len());
                if out.shards.is_empty() {
                    return got;
                }
                seq += 1;
                got.push(out.shards);
            }
        });
    }
    let mut calls: Vec<Vec<Claimed>> = Vec::new();
    while let Some(r) = set.join_next().await {
        calls.extend(r.expect("claimer task panicked"));
    }
    let claims: Vec<Claimed> = calls.iter().flatten().cloned().collect();

    let mut seen = vec![0u32; SHARDS];
    for c in &claims {
        assert_eq!(c.shard_ref.task, "t");
        seen[index(c) as usize] += 1;
    }
    let wrong: Vec<(usize, u32)> = seen.iter().copied().enumerate().filter(|&(_, n)| n != 1).collect();
    assert!(wrong.is_empty(), "shards not claimed exactly once (index, times): {wrong:?}");
    // one token per claim call: shared by the call's shards, unique across calls and claimers
    for call in &calls {
        assert!(call.iter().all(|c| c.token == call[0].token), "one call, one token: {call:?}");
    }
    let tokens: HashSet<&str> = calls.iter().map(|call| call[0].token.as_str()).collect();
    assert_eq!(tokens.len(), calls.len(), "claim tokens must be unique per call");

    // `active` holds every shard under the very token the wrapper handed out
    for chunk in claims.chunks(500) {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(env.keys.active());
        for c in chunk {
            hmget.arg(c.shard_ref.to_string());
        }
        let held: Vec<Option<String>> = env.cmd(&hmget).await;
        for (c, h) in chunk.iter().zip(held) {
            assert_eq!(h.as_deref(), Some(c.token.as_str()), "holder of {}", c.shard_ref);
        }
    }
    let fields: u64 = env.cmd(redis::cmd("HLEN").arg(env.keys.active())).await;
    let pinned: bool = env.cmd(redis::cmd("HEXISTS").arg(env.keys.active()).arg(ACTIVE_PIN)).await;
    assert!(pinned, "`active` must keep its pin");
    assert_eq!(fields - 1, SHARDS as u64, "every claimed shard must be active, nothing else");
    // every claimer that got shards holds a lease
    let instances: BTreeSet<&str> = tokens.iter().map(|t| t.rsplit_once(':').expect("`<instance>:<seq>`").0).collect();
    for instance in instances {
        assert!(env.lease_ttl(instance).await.is_some(), "claimer {instance} must hold a lease");
    }
    assert_eq!(env.count("t", "cursor").await, SHARDS as u64);
}

#[tokio::test]
async fn stale_holder_is_refused_after_its_lock_expired() {
    let mut env = ScriptEnv::start("stale_holder").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    let old = env.claim("old", 1, 1, 300).await.shards.remove(0);
    let r = old.shard_ref.to_string();
    assert_eq!((r.as_str(), old.attempt), ("t:1:0", 1));
    assert!(env.extend("old", &[&old], 300).await.is_empty(), "a fresh lease must extend");

    sleep_ms(450).await;
    assert_eq!(env.lease_ttl("old").await, None, "the lease must have expired");
    // the expired lease's shard comes back at the first sweep
    let recovered = env.sweep(50, 5).await.expect("the sweep runs");
    assert_eq!((recovered.recovered, recovered.marked), (1, 0), "recovered at once: {recovered:?}");
    assert!(env.active().await.is_empty(), "the recovered shard is held by nobody");
    assert_eq!(env.wait_list().await, [r.as_str()], "the recovered shard waits");

    // nobody holds it: the old holder sees LockMissing everywhere, nothing changes
    assert_eq!(env.extend("old", &[&old], 300).await, [0], "extend must report the recovered shard lost");
    assert_eq!(env.holder(&r).await, None, "a lost extend must not take the shard back");
    assert!(env.lease_ttl("old").await.is_some(), "the heartbeat takes the lease again: its executor lives");
    assert_eq!(env.complete(&old, "1").await, Err(ScriptCode::LockMissing));
    assert_eq!(env.fail(&old, 0, "x").await, Err(ScriptCode::LockMissing));
    assert_eq!(env.release(&old).await, Err(ScriptCode::LockMissing));
    assert!(env.active().await.is_empty(), "a refused call must not make the shard active");
    assert_eq!(env.wait_list().await, [r.as_str()], "a refused call must leave the shard waiting");
    assert_eq!((env.count("t", "done").await, env.count("t", "failed").await), (0, 0));

    let new = env.claim("new", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!((new.shard_ref.to_string(), new.attempt), (r.clone(), 2), "re-claim of the stalled shard");

    // now another token holds it: LockMismatch, and the new holder keeps it. The old executor's
    // lease lapses again (it froze once more), so that its heartbeat checks what it holds.
    env.drop_lease("old").await;
    assert_eq!(env.extend("old", &[&old], 300).await, [0], "the old token is lost");
    assert!(env.extend("new", &[&new], LONG_LOCK).await.is_empty(), "the new token is kept");
    assert_eq!(env.complete(&old, "stale").await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.fail(&old, 0, "stale").await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.release(&old).await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.holder(&r).await.as_deref(), Some(new.token.as_str()), "refusals must keep the new holder");
    assert_eq!(env.count("t", "done").await, 0, "stale work must not be counted");
    assert_eq!(env.count("t", "failed").await, 0, "stale failure must not be counted");

    assert_eq!(env.complete(&new, r#""fresh""#).await, Ok(1), "the holder's complete counts");
    assert_eq!(env.count("t", "done").await, 1);
    let kept: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.results("t")).arg(0)).await;
    assert_eq!(kept.as_deref(), Some(r#""fresh""#), "the result is the holder's, not the stale one");
    let state: bool = env.cmd(redis::cmd("HLEN").arg(env.keys.shards("t"))).await;
    assert!(!state, "shard:{r} must be gone once the shard is terminal");

    // token mismatch without a sweep: someone else's token holds the shard; the holder's lease
    // lapsed, so its heartbeat checks (while a lease lives, no sweep can take its shards)
    let mine = env.claim("mine", 1, 1, LONG_LOCK).await.shards.remove(0);
    let r1 = mine.shard_ref.to_string();
    env.set_holder(&r1, "intruder:1").await;
    env.drop_lease("mine").await;
    assert_eq!(env.extend("mine", &[&mine], LONG_LOCK).await, [0]);
    assert_eq!(env.complete(&mine, "1").await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.fail(&mine, 0, "x").await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.release(&mine).await, Err(ScriptCode::LockMismatch));
    assert_eq!(env.holder(&r1).await.as_deref(), Some("intruder:1"), "a mismatch must not touch the holder");
    assert_eq!(env.count("t", "done").await, 1);
}

#[tokio::test]
async fn stalled_shard_is_reclaimed_after_lock_expiry() {
    let mut env = ScriptEnv::start("stalled_reclaimed").await;
    env.dispatch(&TaskSpec::new("t", "noop", 2)).await;
    let first = env.claim("dead", 0, 1, 100).await.shards.remove(0);
    let r = first.shard_ref.to_string();
    let live = env.claim("live", 0, 1, LONG_LOCK).await.shards.remove(0);
    // the full sweep runs first, while every lease lives: it finds nothing
    let s0 = env.sweep(60_000, 1).await.expect("the first full sweep runs");
    assert_eq!(s0, Default::default());
    let out = scripts::sweep(&mut env.con, &env.keys, 60_000, 1).await.expect("sweep");
    assert_eq!(out.report, None, "nothing expired, the full sweep ran within its interval");
    let next = out.next_expiry_in_ms.expect("leases are held");
    assert!(next <= 100, "the dead holder's lease is the earliest to expire: in {next} ms");
    sleep_ms(250).await;

    // the dead holder's lease expired: the next call recovers its shard at once, although the
    // full sweep is throttled for a minute
    let s1 = env.sweep(60_000, 1).await.expect("the lease pass runs");
    assert_eq!((s1.recovered, s1.failed, s1.marked), (1, 0, 0), "recovered at once: {s1:?}");
    assert_eq!(env.wait_list().await, [r.as_str()], "the recovered shard waits");
    let gone: Option<u64> = env.cmd(redis::cmd("ZSCORE").arg(env.keys.leases()).arg("dead")).await;
    assert_eq!(gone, None, "the expired lease goes with its shards");
    assert_eq!(env.sweep(60_000, 1).await, None, "nothing more to do");
    assert_eq!(env.active().await, [live.shard_ref.to_string()], "the live shard stays active");

    let again = env.claim("next", 0, 1, LONG_LOCK).await.shards;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].shard_ref.to_string(), again[0].attempt, again[0].fails), (r.clone(), 2, 0));
    assert_eq!(env.complete(&again[0], "").await, Ok(1));
    assert_eq!(env.complete(&live, "").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 2);
    let state: bool = env.cmd(redis::cmd("HLEN").arg(env.keys.shards("t"))).await;
    assert!(!state, "shard:{r} must be gone once completed");
}

#[tokio::test]
async fn shards_of_a_holder_without_a_lease_entry_are_marked_then_confirmed() {
    let mut env = ScriptEnv::start("stalled_no_lease").await;
    env.dispatch(&TaskSpec::new("t", "noop", 2)).await;
    let lost = env.claim("lost", 0, 1, LONG_LOCK).await.shards.remove(0);
    let r = lost.shard_ref.to_string();
    let live = env.claim("live", 0, 1, LONG_LOCK).await.shards.remove(0);
    // its lease entry vanishes (lost with a failed-over server's data): nothing expires, so only
    // the full sweep finds it, in two steps (Bull's mark-then-confirm)
    env.remove_lease("lost").await;
    let s1 = env.sweep(300, 1).await.expect("first sweep runs");
    assert_eq!((s1.recovered, s1.failed, s1.marked), (0, 0, 1), "first sweep marks only: {s1:?}");
    let marked: Vec<String> = env.cmd(redis::cmd("SMEMBERS").arg(env.keys.stalled())).await;
    assert_eq!(marked, [r.as_str()], "only the shard of the holder without a lease is a candidate");
    assert_eq!(env.sweep(300, 1).await, None, "a second sweep within the interval is throttled");
    assert!(env.wait_list().await.is_empty(), "marking must not move the shard yet");
    let s2 = env.sweep_after(300, 1).await;
    assert_eq!((s2.recovered, s2.failed), (1, 0), "second sweep recovers: {s2:?}");
    assert_eq!(env.wait_list().await, [r.as_str()], "the recovered shard waits");
    assert_eq!(env.active().await, [live.shard_ref.to_string()], "the live shard stays active");
    // a mark whose holder came back in between is not confirmed
    let again = env.claim("back", 0, 1, LONG_LOCK).await.shards.remove(0);
    env.remove_lease("back").await;
    assert_eq!(env.sweep_after(300, 1).await.marked, 1);
    assert!(env.extend_checked("back", &[&again], LONG_LOCK, true).await.is_empty(), "it comes back");
    assert_eq!(env.sweep_after(300, 1).await, Default::default(), "its mark is not confirmed");
    assert_eq!(env.holder(&r).await.as_deref(), Some(again.token.as_str()));
}

#[tokio::test]
async fn shard_stalled_past_the_cap_fails_for_good() {
    let mut env = ScriptEnv::start("stalled_cap").await;
    env.dispatch(&TaskSpec::new("t", "noop", 1)).await;
    let c = env.claim("a", 0, 1, 100).await.shards.remove(0);
    let r = c.shard_ref.to_string();

    // first stall: survived (max_stalled = 1)
    sleep_ms(200).await;
    assert_eq!(env.sweep(50, 1).await.map(|s| s.recovered), Some(1));
    let c2 = env.claim("b", 0, 1, 100).await.shards.remove(0);
    assert_eq!((c2.shard_ref.to_string(), c2.attempt), (r.clone(), 2));

    // second stall: over the cap, failed for good
    sleep_ms(200).await;
    let s4 = env.sweep(50, 1).await.expect("the lease pass runs");
    assert_eq!((s4.recovered, s4.failed), (0, 1), "the second stall must fail the shard: {s4:?}");

    let reason: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.errors("t")).arg(0)).await;
    assert_eq!(reason.as_deref(), Some(STALLED_REASON), "the stall reason must be stored");
    assert_eq!((env.count("t", "done").await, env.count("t", "failed").await), (0, 1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"), "the task still completes");
    assert_eq!(env.wait_list().await, ["t:1:agg"], "the aggregation job is queued, the shard is not");
    assert!(env.active().await.is_empty());
    // its state is gone once failed for good; only the record of its failure stays, beside its
    // reason (when and at which attempt; its node is not known to the sweep)
    let state: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(env.keys.shards("t"))).await;
    assert_eq!(state.keys().collect::<Vec<_>>(), ["0:failure"], "shard:{r}'s state must be gone: {state:?}");
    assert!(state["0:failure"].ends_with(" ?"), "{state:?}");
    assert_eq!(env.complete(&c2, "").await, Err(ScriptCode::LockMissing), "the stalled holder is stale");
}

#[tokio::test]
async fn shard_finished_twice_is_counted_once() {
    let mut env = ScriptEnv::start("finished_twice").await;
    let mut spec = TaskSpec::new("t", "noop", 2);
    spec.attempts = 1;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 1, LONG_LOCK).await.shards.remove(0);
    let r = c.shard_ref.to_string();
    assert_eq!(env.complete(&c, "1").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 1);

    // a second holder of the same ref, forced in behind the scripts' backs
    let forge = |token: &str| Claimed {
        shard_ref: c.shard_ref.clone(),
        token: token.into(),
        attempt: 1,
        fails: 0,
        task_inc: c.task_inc.clone(),
        backup: false,
    };
    for (token, finish_as_fail) in [("forged:1", false), ("forged:2", true)] {
        env.set_holder(&r, token).await;
        let f = forge(token);
        let code = if finish_as_fail { env.fail(&f, 0, "late failure").await } else { env.complete(&f, "2").await };
        assert_eq!(code, Ok(0), "finishing {r} again (as fail: {finish_as_fail}) must report already terminal");
        assert_eq!(env.count("t", "done").await, 1, "done must not move");
        assert_eq!(env.count("t", "failed").await, 0, "failed must not move");
    }
    let result: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.results("t")).arg(0)).await;
    assert_eq!(result.as_deref(), Some("1"), "the first result stays");
    let errors: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(env.keys.errors("t"))).await;
    assert!(errors.is_empty(), "a late failure of a completed shard must leave no reason: {errors:?}");
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));

    let last = env.claim("a", 1, 5, LONG_LOCK).await.shards;
    assert_eq!(last.len(), 1, "only shard 1 is left: {last:?}");
    assert_eq!(env.complete(&last[0], "3").await, Ok(1));
    let (done, failed, total) =
        (env.count("t", "done").await, env.count("t", "failed").await, env.count("t", "total").await);
    assert_eq!(done + failed, total, "done {done} + failed {failed} must equal total {total}");
    assert_eq!(env.wait_list().await, ["t:1:agg"], "one aggregation job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregation_is_enqueued_once_under_racing_completions() {
    const N: u64 = 500;
    let mut env = ScriptEnv::start("agg_once").await;
    env.dispatch(&TaskSpec::new("t", "noop", N)).await;

    // claim everything over several connections
    let mut claims = Vec::new();
    let mut cons = Vec::new();
    for _ in 0..4 {
        cons.push(env.manager().await);
    }
    let mut round = 0u64;
    loop {
        let mut got = 0;
        for (w, con) in cons.iter_mut().enumerate() {
            let base = format!("exec-{w}");
            let req = ClaimRequest {
                count: 25,
                lock_ms: LONG_LOCK,
                instance: &base,
                seq: round,
                node: "test-node",
                ahead: 0,
                speeds: None,
                kinds: &Served::Every,
            };
            let out = scripts::claim(con, &env.keys, &req).await.expect("claim");
            got += out.shards.len();
            claims.extend(out.shards);
        }
        round += 1;
        if got == 0 {
            break;
        }
    }
    assert_eq!(claims.len() as u64, N, "every shard claimed");

    // complete concurrently from 8 tasks, a few per call
    let per = claims.len().div_ceil(8);
    let mut set = tokio::task::JoinSet::new();
    for part in claims.chunks(per).map(<[Claimed]>::to_vec) {
        let mut con = env.manager().await;
        let keys = env.keys.clone();
        set.spawn(async move {
            let mut codes = Vec::new();
            for batch in part.chunks(3) {
                let results: Vec<String> = batch.iter().map(|c| format!("{{\"i\":{}}}", index(c))).collect();
                let items: Vec<Finished<'_>> = batch
                    .iter()
                    .zip(&results)
                    .map(|(c, r)| Finished { claim: c, outcome: FinishedAs::Completed(r), ran_ms: None })
                    .collect();
                codes.extend(scripts::finish(&mut con, &keys, NODE, &items).await.expect("finish"));
            }
            codes
        });
    }
    while let Some(codes) = set.join_next().await {
        let codes = codes.expect("completer panicked");
        assert!(codes.iter().all(|c| *c == Ok(1)), "every first completion counts: {codes:?}");
    }

    let wait = env.wait_list().await;
    assert_eq!(wait.iter().filter(|r| *r == "t:1:agg").count(), 1, "exactly one aggregation job: {wait:?}");
    assert_eq!(wait.len(), 1, "nothing else waits: {wait:?}");
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    assert_eq!(env.count("t", "done").await, N);
    let results: u64 = env.cmd(redis::cmd("HLEN").arg(env.keys.results("t"))).await;
    assert_eq!(results, N, "every shard's result is available to the aggregation");

    let agg = env.claim("agg", 0, 5, LONG_LOCK).await.shards;
    assert_eq!(agg.len(), 1, "only the aggregation job is claimable: {agg:?}");
    let agg = &agg[0];
    assert_eq!(agg.shard_ref, ShardRef::aggregate("t", 1));
    let total = r#"{"sum":124750}"#;
    assert_eq!(env.complete(agg, total).await, Ok(1), "aggregation completes");
    let info = TaskInfo::from_hash("t", &env.task("t").await).unwrap().unwrap();
    assert_eq!(info.state, TaskState::Completed);
    assert_eq!(info.result, Some(serde_json::json!({"sum": 124750})));
    assert!(info.finished_ms.is_some_and(|f| f >= info.created_ms), "ended after it was created: {info:?}");

    assert_eq!(env.complete(agg, r#"{"sum":0}"#).await, Err(ScriptCode::LockMissing), "second completion");
    assert_eq!(env.field("t", "result").await.as_deref(), Some(total), "the result is recorded once");
    assert_eq!(env.field("t", "finished_ms").await, info.finished_ms.map(|f| f.to_string()), "ended once");
    assert!(env.claim("late", 0, 5, LONG_LOCK).await.shards.is_empty(), "nothing is left");
}

#[tokio::test]
async fn failed_shards_still_complete_the_task() {
    const N: u64 = 6;
    let mut env = ScriptEnv::start("fail_cap").await;
    let mut spec = TaskSpec::new("t", "fail", N);
    spec.attempts = 2;
    env.dispatch(&spec).await;

    let first = env.claim("a", 0, 10, LONG_LOCK).await.shards;
    assert_eq!(first.len() as u64, N);
    for c in &first {
        assert_eq!(env.fail(c, 300, "boom-1").await, Ok(2), "first failure of {} retries", c.shard_ref);
    }
    let delayed: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.delayed())).await;
    assert_eq!(delayed, N, "every retry waits for its backoff");
    let early = env.claim("b", 0, 10, LONG_LOCK).await;
    assert!(early.shards.is_empty(), "retries are not due yet: {:?}", early.shards);
    let due = early.next_due_in_ms.expect("claim reports when the earliest retry is due");
    assert!((1..=300).contains(&due), "due within the backoff, by the server's clock: {due} ms");

    sleep_ms(350).await;
    let second = env.claim("b", 0, 10, LONG_LOCK).await.shards;
    assert_eq!(second.len() as u64, N, "every due retry is claimable");
    for c in &second {
        assert_eq!((c.attempt, c.fails), (2, 1), "retry of {}", c.shard_ref);
        assert_eq!(env.fail(c, 1000, "boom-2").await, Ok(1), "second failure of {} is final", c.shard_ref);
    }
    assert_eq!((env.count("t", "done").await, env.count("t", "failed").await), (0, N));
    let errors: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(env.keys.errors("t"))).await;
    assert_eq!(errors.len() as u64, N, "one reason per failed shard: {errors:?}");
    assert!(errors.values().all(|v| v == "boom-2"), "the last reason is kept: {errors:?}");
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    assert_eq!(env.wait_list().await, ["t:1:agg"]);
    // no per-shard state outlives a terminal shard: only the record of each failure stays, beside
    // its reason (docs/design/dashboard.md)
    let leftovers: Vec<String> = env.cmd(redis::cmd("HKEYS").arg(env.keys.shards("t"))).await;
    let (records, state): (Vec<&String>, Vec<&String>) = leftovers.iter().partition(|f| f.ends_with(":failure"));
    assert!(state.is_empty(), "no per-shard state may outlive a terminal shard: {state:?}");
    assert_eq!(records.len() as u64, N, "{records:?}");

    let agg = env.claim("c", 0, 1, LONG_LOCK).await.shards.remove(0);
    assert!(agg.shard_ref.is_aggregate());
    assert_eq!(env.complete(&agg, r#"{"failed":6}"#).await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("failed"), "failed shards fail the task");
    assert_eq!(env.field("t", "result").await.as_deref(), Some(r#"{"failed":6}"#), "the result is kept");
}

#[tokio::test]
async fn released_shards_go_first_and_are_claimable_at_once() {
    let mut env = ScriptEnv::start("release_front").await;
    env.dispatch(&TaskSpec::new("t", "noop", 5)).await;
    let held = env.claim("a", 0, 3, LONG_LOCK).await.shards;
    let refs: Vec<String> = held.iter().map(|c| c.shard_ref.to_string()).collect();
    assert_eq!(refs, ["t:1:0", "t:1:1", "t:1:2"]);

    assert_eq!(env.release(&held[2]).await, Ok(1));
    assert_eq!(env.release(&held[0]).await, Ok(1));
    assert_eq!(env.wait_list().await, ["t:1:0", "t:1:2"], "each release goes to the front of wait");
    assert_eq!(env.holder("t:1:0").await, None, "release drops the hold");
    assert_eq!(env.active().await, ["t:1:1"], "released shards leave active");
    assert_eq!(env.release(&held[0]).await, Err(ScriptCode::LockMissing), "a second release is refused");

    // same instant, fresh shards still in the cursor: the released ones come first
    let next = env.claim("b", 0, 1, LONG_LOCK).await.shards;
    assert_eq!(next.len(), 1);
    assert_eq!((next[0].shard_ref.to_string(), next[0].attempt, next[0].fails), ("t:1:0".into(), 2, 0));
    let next = env.claim("b", 1, 1, LONG_LOCK).await.shards;
    assert_eq!((next[0].shard_ref.to_string(), next[0].attempt, next[0].fails), ("t:1:2".into(), 2, 0));
    let next = env.claim("b", 2, 1, LONG_LOCK).await.shards;
    assert_eq!((next[0].shard_ref.to_string(), next[0].attempt), ("t:1:3".into(), 1), "then the cursor");
    assert_eq!(env.count("t", "failed").await, 0, "a release is not a failure");
}

/// Shards claimed ahead and never started are given back with their claim undone: to the front
/// (shutdown) or behind what waits (an executor trimming what it holds ahead); the next claim
/// hands out the same attempt number, and no state is left for a shard that had none.
#[tokio::test]
async fn unstarted_shards_are_given_back_with_their_claim_undone() {
    let mut env = ScriptEnv::start("give_back").await;
    env.dispatch(&TaskSpec::new("t", "noop", 4)).await;
    let held = env.claim("a", 0, 3, LONG_LOCK).await.shards;
    // t:1:0 was claimed before: given back started, so its next claim is its second
    assert_eq!(env.release(&held[0]).await, Ok(1));
    let again = env.claim("a", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!((again.shard_ref.to_string(), again.attempt), ("t:1:0".into(), 2));
    for (c, how) in [(&again, GiveBack::Behind), (&held[1], GiveBack::Unstarted), (&held[2], GiveBack::Behind)] {
        let r = scripts::release_as(&mut env.con, &env.keys, &[c], how).await.unwrap();
        assert_eq!(r, [Ok(1)], "{how:?}");
    }
    assert_eq!(env.wait_list().await, ["t:1:1", "t:1:0", "t:1:2"], "unstarted to the front, the others behind");
    let attempts: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(env.keys.shards("t"))).await;
    assert_eq!(attempts, HashMap::from([("0:attempt".to_owned(), "1".to_owned())]), "only t:1:0 ran before");
    let next = env.claim("b", 0, 4, LONG_LOCK).await.shards;
    let got: Vec<(String, u32)> = next.iter().map(|c| (c.shard_ref.to_string(), c.attempt)).collect();
    assert_eq!(got, [("t:1:1".into(), 1), ("t:1:0".into(), 2), ("t:1:2".into(), 1), ("t:1:3".into(), 1)]);
    for c in &next {
        assert_eq!(env.complete(c, "").await, Ok(1));
    }
    let left: u64 = env.cmd(redis::cmd("EXISTS").arg(env.keys.shards("t"))).await;
    assert_eq!(left, 0, "no per-shard state is left");
}

/// Every script, and every composed one, compiles on a real server (a syntax error, e.g. a Lua
/// keyword as a variable name, would otherwise show only when that script is first called).
#[tokio::test]
async fn every_script_compiles() {
    let mut env = ScriptEnv::start("compiles").await;
    let all = scripts().all().into_iter().chain(scripts().composed());
    for s in all {
        let r: redis::RedisResult<String> =
            redis::cmd("SCRIPT").arg("LOAD").arg(s.text()).query_async(&mut env.con).await;
        assert_eq!(r.as_deref().map_err(|e| e.to_string()), Ok(s.get_hash()), "{}", s.file());
    }
}

#[tokio::test]
async fn every_wrapper_survives_script_flush() {
    let mut env = ScriptEnv::start("script_flush").await;
    async fn flush(env: &mut ScriptEnv) {
        env.cmd::<()>(redis::cmd("SCRIPT").arg("FLUSH")).await;
        let all: Vec<&str> = scripts().all().into_iter().map(|s| s.get_hash()).collect();
        let loaded: Vec<bool> = env.cmd(redis::cmd("SCRIPT").arg("EXISTS").arg(&all)).await;
        assert!(loaded.iter().all(|l| !l), "SCRIPT FLUSH left scripts loaded: {loaded:?}");
    }
    async fn loaded(env: &mut ScriptEnv, name: &str) {
        let s = scripts().all().into_iter().find(|s| s.file() == name).expect("script");
        let l: Vec<bool> = env.cmd(redis::cmd("SCRIPT").arg("EXISTS").arg(s.get_hash())).await;
        assert_eq!(l, [true], "{name} must have been loaded by the NOSCRIPT fallback");
    }
    let mut spec = TaskSpec::new("t", "noop", 4);
    spec.attempts = 2;

    flush(&mut env).await;
    env.dispatch(&spec).await;
    loaded(&mut env, "dispatch.lua").await;

    flush(&mut env).await;
    let c = env.claim("a", 0, 4, LONG_LOCK).await.shards;
    assert_eq!(c.len(), 4, "claim after flush");
    loaded(&mut env, "claim.lua").await;

    flush(&mut env).await;
    assert!(env.extend("a", &[&c[0], &c[1]], LONG_LOCK).await.is_empty(), "extend after flush");
    loaded(&mut env, "extend.lua").await;

    // the second call of extend (the lease had expired) after a flush too
    env.drop_lease("a").await;
    flush(&mut env).await;
    assert!(env.extend("a", &[&c[0], &c[1]], LONG_LOCK).await.is_empty(), "extend of a lapsed lease after flush");
    loaded(&mut env, "extend.lua").await;
    assert!(env.lease_ttl("a").await.is_some(), "the lease is taken again");

    flush(&mut env).await;
    assert_eq!(env.complete(&c[0], "1").await, Ok(1), "complete after flush");
    loaded(&mut env, "complete.lua").await;

    flush(&mut env).await;
    assert_eq!(env.fail(&c[1], 10, "x").await, Ok(2), "fail after flush");
    loaded(&mut env, "fail.lua").await;

    flush(&mut env).await;
    assert_eq!(env.release(&c[2]).await, Ok(1), "release after flush");
    loaded(&mut env, "release.lua").await;

    flush(&mut env).await;
    let s = env.sweep(1000, 1).await.expect("sweep after flush runs");
    assert_eq!(s, Default::default(), "every active shard's holder has a lease");
    loaded(&mut env, "sweep.lua").await;

    flush(&mut env).await;
    sleep_ms(30).await;
    let moved = scripts::promote(&mut env.con, &env.keys).await.expect("promote after flush");
    assert_eq!(moved, 1, "the due retry of {} is promoted", c[1].shard_ref);
    loaded(&mut env, "promote.lua").await;
    assert_eq!(env.wait_list().await, [c[2].shard_ref.to_string(), c[1].shard_ref.to_string()]);
}

#[tokio::test]
async fn paused_queue_hands_out_nothing() {
    let mut env = ScriptEnv::start("paused").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    env.cmd::<()>(redis::cmd("HSET").arg(env.keys.meta()).arg("paused").arg(1)).await;

    let out = env.claim("a", 0, 3, LONG_LOCK).await;
    assert!(out.paused, "claim must report the pause");
    assert!(out.shards.is_empty(), "a paused queue hands out nothing: {:?}", out.shards);
    assert_eq!(out.next_due_in_ms, None);
    assert_eq!(env.count("t", "cursor").await, 0, "the cursor must not move while paused");
    assert!(env.active().await.is_empty());

    env.cmd::<()>(redis::cmd("HSET").arg(env.keys.meta()).arg("paused").arg(0)).await;
    let out = env.claim("a", 0, 3, LONG_LOCK).await;
    assert!(!out.paused);
    assert_eq!(out.shards.len(), 3, "resumed queue hands out work");
}

#[tokio::test]
async fn every_key_of_a_queue_shares_one_cluster_slot() {
    let mut env = ScriptEnv::start("one_slot").await;
    let mut seen = BTreeSet::new();
    let mut spec = TaskSpec::new("t", "noop", 6);
    spec.attempts = 2;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 6, LONG_LOCK).await.shards;
    // dispatched after: a claim of both would share them (docs/design/fairness.md)
    env.dispatch(&TaskSpec::new("u", "noop", 1)).await;
    seen.extend(env.all_keys().await);
    let stuck = env.claim("b", 0, 1, 100).await.shards.remove(0);
    seen.extend(env.all_keys().await);
    assert_eq!(stuck.shard_ref, ShardRef::shard("u", 2, 0), "the other task's shard, left to stall");
    assert!(env.extend("a", &[&c[0], &c[1]], LONG_LOCK).await.is_empty());
    assert_eq!(env.complete(&c[0], "1").await, Ok(1));
    // due again by the time the sweeps below are done
    assert_eq!(env.fail(&c[1], 100, "retry me").await, Ok(2));
    assert_eq!(env.release(&c[2]).await, Ok(1));
    seen.extend(env.all_keys().await);

    // its holder's lease entry vanishes: the full sweep marks, then confirms (keys `stalled` and
    // `stalled-check` are seen)
    env.remove_lease("b").await;
    assert_eq!(env.sweep(300, 1).await.map(|s| s.marked), Some(1), "the stuck shard is marked");
    seen.extend(env.all_keys().await);
    assert_eq!(env.sweep_after(300, 1).await.recovered, 1);
    seen.extend(env.all_keys().await);
    for held in &c[3..] {
        assert_eq!(env.complete(held, "1").await, Ok(1), "{}", held.shard_ref);
    }

    // drive task t to its end: retry, released and remaining shards, then the aggregation
    let rest = env.claim("d", 0, 10, LONG_LOCK).await.shards;
    for r in &rest {
        let code = if r.shard_ref.task == "t" && r.fails > 0 {
            env.fail(r, 0, "final").await
        } else {
            env.complete(r, "1").await
        };
        assert_eq!(code, Ok(1), "{}", r.shard_ref);
    }
    seen.extend(env.all_keys().await);
    let aggs = env.claim("e", 0, 10, LONG_LOCK).await.shards;
    assert_eq!(aggs.len(), 2, "both tasks aggregate: {aggs:?}");
    seen.extend(env.all_keys().await);
    for a in &aggs {
        assert_eq!(env.complete(a, "{}").await, Ok(1));
    }
    seen.extend(env.all_keys().await);

    let p = env.keys.prefix().to_owned();
    let kinds = [
        "meta",
        "kinds",
        "kind:noop:tasks",
        "kind:noop:wait",
        "kind:noop:marker",
        "kind:*:marker",
        "index",
        "task:t",
        "task:t:terminal",
        "task:t:results",
        "task:t:errors",
        "delayed",
        "active",
        "leases",
        "running",
        "finished",
        "events",
        "stalled",
        "stalled-check",
        "task:t:shards",
    ];
    for k in kinds {
        assert!(seen.contains(&format!("{p}{k}")), "the run never created {p}{k}; saw {seen:?}");
    }
    let slot = key_slot(&p);
    let off: Vec<(&String, u16)> = seen.iter().map(|k| (k, key_slot(k))).filter(|&(_, s)| s != slot).collect();
    assert!(off.is_empty(), "keys outside the queue's slot {slot}: {off:?}");
}

// Regression: claim.lua once built tokens with `..`, which prints seq >= 10^14 as `1e+14`, so the
// holder was refused its own shard and seqs equal in 14 digits shared a token.
#[tokio::test]
async fn claim_tokens_match_the_lock_for_any_seq() {
    let mut env = ScriptEnv::start("token_seq").await;
    env.dispatch(&TaskSpec::new("t", "noop", 2)).await;
    let seq = 100_000_000_000_000u64;
    let c = env.claim("b", seq, 2, LONG_LOCK).await.shards;
    for claim in &c {
        assert_eq!(claim.token, format!("b:{seq}"), "the token is `<instance>:<seq>` in full digits");
        let holder = env.holder(&claim.shard_ref.to_string()).await;
        assert_eq!(
            holder.as_deref(),
            Some(claim.token.as_str()),
            "holder of {} vs the wrapper's token",
            claim.shard_ref
        );
    }
    assert_eq!(env.complete(&c[0], "").await, Ok(1), "the holder must be able to complete");
}

/// Calls per command since the last `CONFIG RESETSTAT` (commands run by scripts included).
async fn command_calls(env: &mut ScriptEnv) -> HashMap<String, u64> {
    let info: String = env.cmd(redis::cmd("INFO").arg("commandstats")).await;
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The holders of `claims`' refs in `active`, in order.
async fn holders(env: &mut ScriptEnv, claims: &[&Claimed]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for c in claims {
        out.push(env.holder(&c.shard_ref.to_string()).await);
    }
    out
}

fn tokens(claims: &[&Claimed]) -> Vec<Option<String>> {
    claims.iter().map(|c| Some(c.token.clone())).collect()
}

#[tokio::test]
async fn heartbeat_with_a_live_lease_is_one_call_and_keeps_every_shard() {
    let mut env = ScriptEnv::start("beat_live").await;
    env.dispatch(&TaskSpec::new("t", "noop", 300)).await;
    let mut held = env.claim("ex", 1, 200, 1000).await.shards;
    held.extend(env.claim("ex", 2, 100, 1000).await.shards);
    assert_eq!(held.len(), 300);
    let held: Vec<&Claimed> = held.iter().collect();
    // loads the script, so that the measured beat is the call itself
    assert!(env.extend("ex", &held, 1000).await.is_empty());

    sleep_ms(300).await;
    let ttl = env.lease_ttl("ex").await.expect("the lease lives");
    assert!(ttl <= 750, "the lease must have aged: {ttl} ms left");
    env.cmd::<()>(redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let lost = env.extend("ex", &held, LONG_LOCK).await;
    let calls = command_calls(&mut env).await;
    assert!(lost.is_empty(), "a live lease keeps every shard: lost {lost:?}");
    let scripts_run = calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0);
    assert_eq!(scripts_run, 1, "a beat with a live lease is one script call: {calls:?}");
    let other: Vec<(&String, &u64)> = calls
        .iter()
        .filter(|(name, _)| {
            let command = name.split('|').next().unwrap_or(name);
            !["evalsha", "eval", "zscore", "zadd", "time", "hget", "config", "info"].contains(&command)
        })
        .collect();
    assert!(other.is_empty(), "a beat with a live lease only extends the lease, it reads no shard: {other:?}");
    assert_eq!(calls.get("zadd"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("hget"), Some(&1), "one read of the cancellation count: {calls:?}");

    let ttl = env.lease_ttl("ex").await.expect("the lease lives");
    assert!(ttl > LONG_LOCK - 5_000, "the lease was extended to the new lock duration: {ttl} ms left");
    assert_eq!(holders(&mut env, &held).await, tokens(&held), "every shard keeps its holder");
    let s = env.sweep(50, 1).await.expect("the sweep runs");
    assert_eq!(s, Default::default(), "no shard of a live executor is stalled");
    let s = env.sweep_after(50, 1).await;
    assert_eq!(s, Default::default(), "nor on the next sweep");
    assert_eq!(env.active().await.len(), 300);
}

#[tokio::test]
async fn extend_after_the_lease_expired_keeps_the_shards_no_sweep_recovered() {
    let mut env = ScriptEnv::start("beat_lapsed").await;
    env.dispatch(&TaskSpec::new("t", "noop", 4)).await;
    let mut held = env.claim("ex", 1, 2, 100).await.shards;
    held.extend(env.claim("ex", 2, 1, 100).await.shards);
    let held: Vec<&Claimed> = held.iter().collect();
    assert_eq!(held.len(), 3);

    sleep_ms(200).await;
    assert_eq!(env.lease_ttl("ex").await, None, "the lease must have expired");
    // no sweep has run since: the shards are still held by their tokens

    // the script alone, without the pairs, cannot vouch for the shards: it refuses to take the
    // lease back blindly
    let blind: (i64, String) = scripts()
        .extend
        .key(env.keys.leases())
        .key(env.keys.active())
        .key(env.keys.meta())
        .arg("ex")
        .arg(LONG_LOCK)
        .arg("beat")
        .arg("0")
        .invoke_async(&mut env.con)
        .await
        .expect("extend without pairs");
    assert_eq!(blind.0, -1, "a lapsed lease and no pairs must ask for the pairs");
    assert_eq!(env.lease_ttl("ex").await, None, "without the pairs the lease must not come back");

    let lost = env.extend("ex", &held, LONG_LOCK).await;
    assert!(lost.is_empty(), "shards no sweep recovered are all kept: lost {lost:?}");
    let ttl = env.lease_ttl("ex").await.expect("the heartbeat re-creates the lease");
    assert!(ttl > LONG_LOCK - 5_000, "{ttl} ms left");
    assert_eq!(holders(&mut env, &held).await, tokens(&held), "every shard keeps its holder");

    let s = env.sweep_after(50, 1).await;
    assert_eq!(s, Default::default(), "nothing stalls: the holder is alive again");
    let stalled: Vec<String> = env.cmd(redis::cmd("SMEMBERS").arg(env.keys.stalled())).await;
    assert!(stalled.is_empty(), "no candidate is left: {stalled:?}");
    assert!(env.wait_list().await.is_empty(), "nothing was recovered");
    for c in &held {
        assert_eq!(env.complete(c, "1").await, Ok(1), "the holder completes {}", c.shard_ref);
    }
    assert_eq!(env.count("t", "done").await, 3);
    assert!(env.active().await.is_empty());
}

#[tokio::test]
async fn extend_after_a_sweep_recovered_some_reports_exactly_those_lost() {
    let mut env = ScriptEnv::start("beat_recovered").await;
    env.dispatch(&TaskSpec::new("t", "noop", 6)).await;
    // first claim call: t:0 and t:1; its lease lapses and the sweep recovers them
    let first = env.claim("ex", 1, 2, 100).await.shards;
    sleep_ms(200).await;
    let s = env.sweep(50, 5).await.expect("the sweep runs");
    assert_eq!((s.recovered, s.failed, s.marked), (2, 0, 0), "{s:?}");
    let waiting = env.wait_list().await;
    assert_eq!(waiting.iter().collect::<BTreeSet<_>>(), ["t:1:0".to_owned(), "t:1:1".to_owned()].iter().collect());
    // another executor claims one of the recovered shards
    let taken = env.claim("other", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(taken.shard_ref.to_string(), waiting[0]);
    // second claim call (the lease lives again for 100 ms): the other recovered shard and t:2;
    // then it lapses again, and no sweep runs before the executor's next beat
    let second = env.claim("ex", 2, 2, 100).await.shards;
    assert_eq!(second[0].shard_ref.to_string(), waiting[1]);
    assert_eq!(second[1].shard_ref.to_string(), "t:1:2");
    sleep_ms(200).await;
    assert_eq!(env.lease_ttl("ex").await, None);

    // pairs interleaved: first[0] second[0] first[1] second[1]
    let held = [&first[0], &second[0], &first[1], &second[1]];
    let lost = env.extend("ex", &held, LONG_LOCK).await;
    assert_eq!(lost, [0, 2], "exactly the recovered shards' old tokens are lost, whoever holds them now");
    assert!(env.lease_ttl("ex").await.is_some(), "the lease is taken again");
    let after = holders(&mut env, &held).await;
    for (i, f) in [(0, &first[0]), (2, &first[1])] {
        let now = if f.shard_ref == taken.shard_ref { &taken.token } else { &second[0].token };
        assert_eq!(after[i].as_ref(), Some(now), "{} keeps its new holder", f.shard_ref);
    }
    assert_eq!((&after[1], &after[3]), (&Some(second[0].token.clone()), &Some(second[1].token.clone())));

    let s = env.sweep_after(50, 5).await;
    assert_eq!(s, Default::default(), "the kept shards are not recovered: their holder is alive");
    assert_eq!(env.complete(&first[0], "1").await, Err(ScriptCode::LockMismatch), "the old holder is stale");
    assert_eq!(env.complete(&first[1], "1").await, Err(ScriptCode::LockMismatch), "the old holder is stale");
    assert_eq!(env.complete(&second[0], "1").await, Ok(1));
    assert_eq!(env.complete(&second[1], "1").await, Ok(1));
    assert_eq!(env.complete(&taken, "1").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 3);
}

#[tokio::test]
async fn one_claim_call_has_one_token_and_active_stays_a_hashtable() {
    let mut env = ScriptEnv::start("one_token").await;
    env.dispatch(&TaskSpec::new("t", "noop", 10)).await;
    // the server would keep a small hash of short fields as a listpack
    let probe = format!("{}probe", env.keys.prefix());
    env.cmd::<()>(redis::cmd("HSET").arg(&probe).arg("t:0").arg("ex:1").arg("t:1").arg("ex:1")).await;
    assert_eq!(env.encoding(&probe).await, "listpack", "the server must default small hashes to listpacks");
    env.cmd::<()>(redis::cmd("DEL").arg(&probe)).await;

    let a = env.claim("ex", 7, 4, LONG_LOCK).await.shards;
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|c| c.token == "ex:7"), "one claim call, one token `<instance>:<seq>`: {a:?}");
    let b = env.claim("ex", 8, 1, LONG_LOCK).await.shards;
    assert_eq!(b[0].token, "ex:8", "the next call has its own token");
    let all: Vec<&Claimed> = a.iter().chain(&b).collect();
    assert_eq!(holders(&mut env, &all).await, tokens(&all), "`active` holds each shard under its call's token");
    let fields: u64 = env.cmd(redis::cmd("HLEN").arg(env.keys.active())).await;
    assert_eq!(fields, 5 + 1, "five shards and the pin");
    let active = env.keys.active();
    assert_eq!(env.encoding(&active).await, "hashtable", "`active` with five shards");

    for c in &all[..4] {
        assert_eq!(env.complete(c, "").await, Ok(1));
    }
    assert_eq!(env.active().await, ["t:1:4"]);
    assert_eq!(env.encoding(&active).await, "hashtable", "`active` with one shard");
    assert_eq!(env.complete(all[4], "").await, Ok(1));
    assert!(env.active().await.is_empty());
    let pin: Option<String> = env.cmd(redis::cmd("HGET").arg(&active).arg(ACTIVE_PIN)).await;
    assert!(pin.is_some_and(|v| v.len() > 64), "the pin stays, with a value over 64 bytes");
    assert_eq!(env.encoding(&active).await, "hashtable", "`active` with no shard");
    let c = env.claim("ex", 9, 1, LONG_LOCK).await.shards;
    assert_eq!(c.len(), 1);
    assert_eq!(env.encoding(&active).await, "hashtable", "`active` after claiming again");
}

#[tokio::test]
async fn complete_batches_of_interleaved_tasks_return_codes_in_the_order_given() {
    let mut env = ScriptEnv::start("interleaved").await;
    for (id, n) in [("a", 4), ("b", 3), ("c", 2), ("gone", 1)] {
        env.dispatch(&TaskSpec::new(id, "noop", n)).await;
    }
    let claimed = env.claim("ex", 1, 20, LONG_LOCK).await.shards;
    assert_eq!(claimed.len(), 10);
    let by_ref: HashMap<String, &Claimed> = claimed.iter().map(|c| (c.shard_ref.to_string(), c)).collect();
    let get = |r: &str| *by_ref.get(r).unwrap_or_else(|| panic!("{r} was not claimed: {claimed:?}"));

    env.set_holder("b:2:2", "other:1").await;
    assert_eq!(env.complete(get("c:3:1"), r#""c1""#).await, Ok(1), "c:1 completes before the batch");
    for k in env.keys.task_keys("gone") {
        env.cmd::<()>(redis::cmd("DEL").arg(k)).await;
    }

    let done = |r: &'static str| FinishedAs::Completed(r);
    let plan: Vec<(&str, FinishedAs<'_>, Result<i64, ScriptCode>)> = vec![
        ("b:2:0", done(r#""b0""#), Ok(1)),
        ("a:1:0", done(r#""a0""#), Ok(1)),
        ("gone:4:0", done(r#""g0""#), Err(ScriptCode::TaskMissing)),
        ("b:2:2", done(r#""b2""#), Err(ScriptCode::LockMismatch)),
        (
            "a:1:1",
            FinishedAs::Failed { delay_ms: 1000, reason: "boom", failure: shardctl_common::failure::Failure::Retry },
            Ok(2),
        ),
        ("c:3:0", done(r#""c0""#), Ok(1)),
        ("a:1:2", done(r#""a2""#), Ok(1)),
        ("c:3:1", done(r#""c1 again""#), Err(ScriptCode::LockMissing)),
        ("b:2:1", done(r#""b1""#), Ok(1)),
        ("a:1:0", done(r#""a0 again""#), Ok(0)),
        ("a:1:3", done(r#""a3""#), Ok(1)),
    ];
    let items: Vec<Finished<'_>> =
        plan.iter().map(|(r, o, _)| Finished { claim: get(r), outcome: o.clone(), ran_ms: None }).collect();
    let codes = scripts::finish(&mut env.con, &env.keys, NODE, &items).await.expect("finish");
    let expected: Vec<(&str, Result<i64, ScriptCode>)> = plan.iter().map(|(r, _, c)| (*r, *c)).collect();
    let got: Vec<(&str, Result<i64, ScriptCode>)> = plan.iter().map(|(r, _, _)| *r).zip(codes).collect();
    assert_eq!(got, expected, "one code per item, in the order given");

    // each result landed at its own task and index
    for (id, want) in [
        ("a", vec![("0", r#""a0""#), ("2", r#""a2""#), ("3", r#""a3""#)]),
        ("b", vec![("0", r#""b0""#), ("1", r#""b1""#)]),
        ("c", vec![("0", r#""c0""#), ("1", r#""c1""#)]),
    ] {
        let results: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(env.keys.results(id))).await;
        let want: HashMap<String, String> = want.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        assert_eq!(results, want, "results of task {id}");
    }
    assert_eq!((env.count("a", "done").await, env.count("b", "done").await, env.count("c", "done").await), (3, 2, 2));
    assert_eq!(env.field("c", "state").await.as_deref(), Some("aggregating"));
    assert_eq!(env.active().await, ["b:2:2"], "only the shard of the other holder stays active");
    assert_eq!(env.holder("b:2:2").await.as_deref(), Some("other:1"));
    let delayed: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.delayed()).arg(0).arg(-1)).await;
    assert_eq!(delayed, ["a:1:1"], "the failed shard waits for its retry");
}

// Regression: a claim once took a lapsed lease back silently, so the heartbeat found a live lease
// and never reported the shards recovered meanwhile. Now the claim says the lease had lapsed and
// the executor's next beat compares every token.
#[tokio::test]
async fn a_claim_renewing_a_lapsed_lease_must_not_hide_lost_shards() {
    let mut env = ScriptEnv::start("claim_hides_loss").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    let lost_one = env.claim("ex", 1, 1, 100).await.shards.remove(0);
    sleep_ms(200).await;
    assert_eq!(env.sweep(50, 5).await.map(|s| s.recovered), Some(1));
    let new_holder = env.claim("other", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(new_holder.shard_ref, lost_one.shard_ref, "another executor took the recovered shard");

    // the executor wakes up: its claim loop claims more work before its heartbeat beats
    let outcome = env.claim("ex", 2, 1, LONG_LOCK).await;
    assert!(outcome.lease_lapsed, "the claim must say it took a lapsed lease again");
    let kept = outcome.shards[0].clone();
    let lost = env.extend_checked("ex", &[&lost_one, &kept], LONG_LOCK, true).await;
    assert_eq!(lost, [0], "the heartbeat must report the shard taken over while its lease was gone");
}

// Completions that ride on a claim (`complete.lua` then `claim.lua` in one call) count exactly as
// on their own, in the order given, and the claim part sees what the completion part wrote: the
// aggregation job the last completion enqueued is claimed by the same call.
#[tokio::test]
async fn completions_recorded_with_a_claim_count_once_and_the_claim_sees_them() {
    let mut env = ScriptEnv::start("complete_claim").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    let first = env.claim("ex", 1, 3, LONG_LOCK).await.shards;
    assert_eq!(first.len(), 3);
    // shard 2 completes alone first: riding again on the claim, it is refused (its lock is gone)
    assert_eq!(env.complete(&first[2], "").await, Ok(1));
    let items: Vec<Finished<'_>> = [(1, r#""one""#), (0, ""), (2, "")]
        .iter()
        .map(|&(i, r)| Finished { claim: &first[i], outcome: FinishedAs::Completed(r), ran_ms: None })
        .collect();
    let req = ClaimRequest {
        count: 5,
        lock_ms: LONG_LOCK,
        instance: "ex",
        seq: 2,
        node: NODE,
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let (codes, claim) =
        scripts::complete_and_claim(&mut env.con, &env.keys, &items, &req).await.expect("complete and claim");
    assert_eq!(codes, [Ok(1), Ok(1), Err(ScriptCode::LockMissing)], "one code per completion, in the order given");
    assert_eq!((env.count("t", "done").await, env.count("t", "total").await), (3, 3));
    let refs: Vec<String> = claim.shards.iter().map(|c| c.shard_ref.to_string()).collect();
    assert_eq!(refs, ["t:1:agg"], "the claim part took the aggregation job the completions enqueued");
    assert_eq!(claim.shards[0].token, "ex:2");
    let result: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.results("t")).arg(1)).await;
    assert_eq!(result.as_deref(), Some(r#""one""#));
    assert_eq!(env.active().await, ["t:1:agg"], "the completed shards left `active`");

    // recorded twice (a retry after a lost reply): refused, nothing counted again
    let (again, _) =
        scripts::complete_and_claim(&mut env.con, &env.keys, &items[..1], &ClaimRequest { seq: 3, ..req.clone() })
            .await
            .expect("again");
    assert_eq!(again, [Err(ScriptCode::LockMissing)]);
    assert_eq!(env.count("t", "done").await, 3);

    // a failure is not a completion: refused before anything is sent
    let failed = [Finished {
        claim: &claim.shards[0],
        outcome: FinishedAs::Failed { delay_ms: 0, reason: "x", failure: shardctl_common::failure::Failure::Retry },
        ran_ms: None,
    }];
    let e = scripts::complete_and_claim(&mut env.con, &env.keys, &failed, &ClaimRequest { seq: 4, ..req })
        .await
        .expect_err("a failure cannot ride on a claim");
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert_eq!(env.active().await, ["t:1:agg"], "nothing was claimed or recorded");
}
