//! Fair sharing and caps (docs/design/fairness.md) at the level of the scripts, against a real
//! redis-server: claims share free slots by the shards each task and group holds, in proportion
//! to weights; a newcomer is served first; priorities stay strict; caps hold for fresh and
//! explicit shards; shards ahead go only to tasks named fast; the counts follow every way a
//! shard leaves `active`, and the sweep rebuilds them.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::collections::{BTreeMap, HashMap};

use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimRequest, Claimed};
use support::ScriptEnv;

const LOCK: u64 = 60_000;

fn per_task(shards: &[Claimed]) -> BTreeMap<String, usize> {
    let mut by_task = BTreeMap::new();
    for c in shards {
        *by_task.entry(c.shard_ref.task.clone()).or_insert(0) += 1;
    }
    by_task
}

fn shares(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
}

/// The counts of the `held` hash: field → count (the usages `u:*` left out).
async fn held(env: &mut ScriptEnv) -> HashMap<String, u64> {
    let key = env.keys.held();
    let all: HashMap<String, String> = env.cmd(redis::cmd("HGETALL").arg(key)).await;
    all.into_iter().filter(|(f, _)| !f.starts_with("u:")).map(|(f, v)| (f, v.parse().unwrap())).collect()
}

/// A claim of `count` of which `ahead` are wanted ahead, as `speeds` says, `probe` ahead for a
/// task it does not name.
async fn claim_ahead(
    env: &mut ScriptEnv,
    seq: u64,
    count: usize,
    ahead: usize,
    speeds: &str,
    probe: usize,
) -> Vec<Claimed> {
    let req = ClaimRequest {
        count,
        lock_ms: LOCK,
        instance: "ex",
        seq,
        node: "n1",
        ahead,
        speeds: Some((speeds, probe)),
        kinds: &Served::Every,
    };
    scripts::claim(&mut env.con, &env.keys, &req).await.expect("claim").shards
}

#[tokio::test]
async fn equal_tasks_hold_equal_shares_and_a_newcomer_is_served_first() {
    let mut env = ScriptEnv::start("fair_equal").await;
    for id in ["a", "b", "c"] {
        env.dispatch(&TaskSpec::new(id, "noop", 100)).await;
    }
    let first = env.claim("ex", 1, 9, LOCK).await.shards;
    assert_eq!(per_task(&first), shares(&[("a", 3), ("b", 3), ("c", 3)]));
    // one slot frees in a: a gets it back (it holds the fewest), not b
    assert_eq!(env.complete(&first[0], "").await, Ok(1));
    assert_eq!(per_task(&env.claim("ex", 2, 1, LOCK).await.shards), shares(&[("a", 1)]));
    // a newcomer gets the next claims until it holds as many (and, having used nothing yet,
    // wins the ties)
    env.dispatch(&TaskSpec::new("small", "noop", 16)).await;
    let got = per_task(&env.claim("ex", 3, 5, LOCK).await.shards);
    assert!(got["small"] >= 4 && got.values().sum::<usize>() == 5, "{got:?}");
}

#[tokio::test]
async fn weights_share_in_proportion_and_groups_share_before_their_tasks() {
    let mut env = ScriptEnv::start("fair_weights").await;
    env.dispatch(&TaskSpec { weight: 3, ..TaskSpec::new("heavy", "noop", 1000) }).await;
    env.dispatch(&TaskSpec::new("light", "noop", 1000)).await;
    assert_eq!(per_task(&env.claim("ex", 1, 40, LOCK).await.shards), shares(&[("heavy", 30), ("light", 10)]));

    // a group of ten tasks against a lone task: half and half, the group's half over its ten
    let mut env = ScriptEnv::start("fair_groups").await;
    for i in 0..10 {
        env.dispatch(&TaskSpec { group: Some("team".into()), ..TaskSpec::new(format!("t{i}"), "noop", 100) }).await;
    }
    env.dispatch(&TaskSpec::new("alone", "noop", 1000)).await;
    let got = per_task(&env.claim("ex", 1, 40, LOCK).await.shards);
    assert_eq!(got["alone"], 20, "{got:?}");
    assert_eq!(got.len(), 11, "every task of the group got some: {got:?}");
    assert!(got.iter().filter(|(t, _)| *t != "alone").all(|(_, &n)| n == 2), "{got:?}");
    assert_eq!(held(&mut env).await["g:team"], 20);
}

#[tokio::test]
async fn priorities_stay_strict() {
    let mut env = ScriptEnv::start("fair_priority").await;
    env.dispatch(&TaskSpec::new("low", "noop", 100)).await;
    env.dispatch(&TaskSpec { priority: 5, ..TaskSpec::new("high", "noop", 10) }).await;
    // high takes all it has although it then holds more than low
    assert_eq!(per_task(&env.claim("ex", 1, 16, LOCK).await.shards), shares(&[("high", 10), ("low", 6)]));
}

#[tokio::test]
async fn a_cap_holds_for_fresh_and_returned_shards_and_frees_as_they_end() {
    let mut env = ScriptEnv::start("fair_cap").await;
    env.dispatch(&TaskSpec { max_running: Some(3), attempts: 5, ..TaskSpec::new("capped", "noop", 50) }).await;
    env.dispatch(&TaskSpec::new("other", "noop", 50)).await;
    let got = env.claim("ex", 1, 20, LOCK).await.shards;
    assert_eq!(per_task(&got), shares(&[("capped", 3), ("other", 17)]));
    let capped: Vec<&Claimed> = got.iter().filter(|c| c.shard_ref.task == "capped").collect();
    // at its cap, a claim gets none of it
    assert_eq!(per_task(&env.claim("ex", 2, 5, LOCK).await.shards), shares(&[("other", 5)]));
    // one fails (to retry at once), one is released: both wait in the lane, and only two
    // slots are free: they come back, no fresh one
    assert_eq!(env.fail(capped[0], 0, "boom").await, Ok(2));
    assert_eq!(env.release(capped[1]).await, Ok(1));
    assert_eq!(held(&mut env).await["capped"], 1);
    let again = env.claim("ex", 3, 10, LOCK).await.shards;
    let back: Vec<&Claimed> = again.iter().filter(|c| c.shard_ref.task == "capped").collect();
    assert_eq!(back.len(), 2, "{again:?}");
    assert!(back.iter().all(|c| c.attempt == 2), "the returned ones, not fresh ones: {back:?}");
    assert_eq!(held(&mut env).await["capped"], 3);
    // completing one frees one slot
    assert_eq!(env.complete(back[0], "").await, Ok(1));
    let next = env.claim("ex", 4, 10, LOCK).await.shards;
    assert_eq!(per_task(&next).get("capped"), Some(&1));
}

#[tokio::test]
async fn a_group_cap_holds_across_its_tasks() {
    let mut env = ScriptEnv::start("fair_group_cap").await;
    let meta = env.keys.meta();
    env.cmd::<()>(redis::cmd("HSET").arg(&meta).arg("group_max:db").arg(4)).await;
    for id in ["x", "y"] {
        env.dispatch(&TaskSpec { group: Some("db".into()), ..TaskSpec::new(id, "noop", 50) }).await;
    }
    assert_eq!(per_task(&env.claim("ex", 1, 20, LOCK).await.shards), shares(&[("x", 2), ("y", 2)]));
    assert!(env.claim("ex", 2, 20, LOCK).await.shards.is_empty());
}

#[tokio::test]
async fn shards_ahead_go_to_short_tasks_none_to_long_ones_and_a_few_to_new_ones() {
    let mut env = ScriptEnv::start("fair_ahead").await;
    env.dispatch(&TaskSpec::new("tiny", "noop", 1000)).await;
    env.dispatch(&TaskSpec::new("long", "noop", 1000)).await;
    // 4 free slots, 100 ahead: the slots are shared, the 100 go to tiny only
    let got = claim_ahead(&mut env, 1, 104, 100, "tiny,-long", 4).await;
    assert_eq!(per_task(&got), shares(&[("tiny", 102), ("long", 2)]));
    // both long: free slots only
    let got = claim_ahead(&mut env, 2, 104, 100, "-tiny,-long", 4).await;
    assert_eq!(got.len(), 4);
    // a task not named is tried: up to the probe ahead, beside what the slots get, once it has
    // been runnable for 20 ms (until then, executors idle beside this one take their part)
    env.dispatch(&TaskSpec::new("new", "noop", 1000)).await;
    let got = claim_ahead(&mut env, 3, 104, 100, "-tiny,-long", 4).await;
    assert_eq!(per_task(&got), shares(&[("new", 4)]));
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let got = per_task(&claim_ahead(&mut env, 4, 104, 100, "-tiny,-long", 4).await);
    // 4 for the slots (by level), and 4 ahead: all new's
    assert_eq!(got.values().sum::<usize>(), 8, "{got:?}");
    assert!(got["new"] >= 4, "{got:?}");
}

#[tokio::test]
async fn the_counts_follow_every_exit_and_the_sweep_rebuilds_them() {
    let mut env = ScriptEnv::start("fair_counts").await;
    env.dispatch(&TaskSpec { group: Some("g".into()), ..TaskSpec::new("t", "noop", 20) }).await;
    let got = env.claim("ex", 1, 10, LOCK).await.shards;
    assert_eq!(held(&mut env).await, HashMap::from([("t".into(), 10), ("g:g".into(), 10)]));
    assert_eq!(env.complete(&got[0], "").await, Ok(1));
    assert_eq!(env.fail(&got[1], 60_000, "later").await, Ok(2));
    assert_eq!(env.release(&got[2]).await, Ok(1));
    let h = held(&mut env).await;
    assert_eq!((h["t"], h["g:g"]), (7, 7), "{h:?}");
    // the released one is claimed again (an explicit ref): counted again
    let again = env.claim("ex", 2, 1, LOCK).await.shards;
    assert_eq!(again[0].shard_ref, got[2].shard_ref);
    assert_eq!(held(&mut env).await["t"], 8);
    assert_eq!(env.release(&again[0]).await, Ok(1));
    // a count gone wrong (by hand here) is exact again after a sweep
    let key = env.keys.held();
    env.cmd::<()>(redis::cmd("HSET").arg(&key).arg("t").arg(99).arg("g:g").arg(1).arg("ghost").arg(5)).await;
    env.sweep_after(1, 5).await;
    assert_eq!(held(&mut env).await, HashMap::from([("t".into(), 7), ("g:g".into(), 7)]));
    // a cancel forgets the task's count, and its group's part
    shardctl_common::control::cancel_in(&mut env.con, &env.keys, "t").await.unwrap();
    assert_eq!(held(&mut env).await, HashMap::new());
}

#[tokio::test]
async fn tasks_at_their_caps_take_no_place_among_the_candidates() {
    let mut env = ScriptEnv::start("fair_capped_window").await;
    // more capped tasks of a higher priority than a claim considers
    for i in 0..70 {
        let spec = TaskSpec { priority: 5, max_running: Some(1), ..TaskSpec::new(format!("c{i}"), "noop", 10) };
        env.dispatch(&spec).await;
    }
    let first = per_task(&env.claim("ex", 1, 100, LOCK).await.shards);
    assert_eq!(first.len(), 64, "one claim considers 64 tasks: {first:?}");
    assert!(first.values().all(|&n| n == 1), "{first:?}");
    let second = per_task(&env.claim("ex", 2, 100, LOCK).await.shards);
    assert_eq!(second.len(), 6, "the capped ones are passed over: {second:?}");
    // all 70 at their caps: a task of a lower priority behind them runs
    env.dispatch(&TaskSpec::new("low", "noop", 10)).await;
    assert_eq!(per_task(&env.claim("ex", 3, 5, LOCK).await.shards), shares(&[("low", 5)]));
}
