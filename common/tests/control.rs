//! The controls of `shardctl_common::control` (cancel, retry, clean) at the script level, one call
//! at a time: the interleavings the CLI tests cannot time (a retry while the aggregation runs, a
//! heartbeat after a cancellation) and the batches of `clean`.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_common::control;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimRequest};
use shardctl_common::ScriptCode;
use support::ScriptEnv;

/// A lease long enough never to expire during a test.
const LONG_LOCK: u64 = 60_000;

#[tokio::test]
async fn a_retry_while_the_aggregation_runs_voids_that_aggregation() {
    let mut env = ScriptEnv::start("retry_agg_race").await;
    let mut spec = TaskSpec::new("t", "noop", 3);
    spec.attempts = 1;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 3, LONG_LOCK).await.shards;
    assert_eq!(c.len(), 3);
    assert_eq!(env.complete(&c[0], "1").await, Ok(1));
    assert_eq!(env.complete(&c[1], "1").await, Ok(1));
    assert_eq!(env.fail(&c[2], 0, "boom").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    // the aggregation job runs (it read 2 done, 1 failed) ...
    let stale = env.claim("b", 0, 1, LONG_LOCK).await.shards.remove(0);
    assert!(stale.shard_ref.is_aggregate());
    // ... when the failed shard is retried, and completes at once
    assert_eq!(shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await.unwrap(), 1);
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
    let again = env.claim("a", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(again.shard_ref.to_string(), "t:1:2");
    assert_eq!(env.complete(&again, "1").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    // the stale aggregation may not end the task with what it read before the retry
    let code = env.complete(&stale, r#"{"completed":2,"failed":1}"#).await;
    assert_eq!(code, Err(ScriptCode::LockMissing), "the aggregation started before the retry was counted");
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    let fresh = env.claim("b", 1, 1, LONG_LOCK).await.shards;
    assert_eq!(fresh.len(), 1, "the new aggregation job is claimable");
    assert!(fresh[0].shard_ref.is_aggregate());
    assert_eq!(env.complete(&fresh[0], r#"{"completed":3,"failed":0}"#).await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("completed"));
    assert_eq!(env.field("t", "result").await.as_deref(), Some(r#"{"completed":3,"failed":0}"#));
}

#[tokio::test]
async fn a_retry_before_the_aggregation_is_claimed_leaves_one_aggregation_job() {
    let mut env = ScriptEnv::start("retry_agg_queued").await;
    let mut spec = TaskSpec::new("t", "noop", 2);
    spec.attempts = 1;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 2, LONG_LOCK).await.shards;
    assert_eq!(env.complete(&c[0], "1").await, Ok(1));
    assert_eq!(env.fail(&c[1], 0, "boom").await, Ok(1));
    assert_eq!(env.wait_list().await, ["t:1:agg"]);
    assert_eq!(shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await.unwrap(), 1);
    assert_eq!(env.wait_list().await, ["t:1:1"], "the queued aggregation no longer applies");
    let again = env.claim("a", 1, 2, LONG_LOCK).await.shards;
    assert_eq!(again.len(), 1);
    assert_eq!(env.complete(&again[0], "1").await, Ok(1));
    assert_eq!(env.wait_list().await, ["t:1:agg"], "one aggregation job");
    assert_eq!((env.count("t", "done").await, env.count("t", "failed").await), (2, 0));
}

#[tokio::test]
async fn after_a_cancel_the_heartbeat_reports_exactly_the_cancelled_tasks_shards_lost() {
    let mut env = ScriptEnv::start("cancel_beat").await;
    env.dispatch(&TaskSpec::new("x", "noop", 2)).await;
    env.dispatch(&TaskSpec::new("y", "noop", 2)).await;
    let held = env.claim("a", 0, 4, LONG_LOCK).await.shards;
    assert_eq!(held.len(), 4);
    let pairs: Vec<(String, String)> = held.iter().map(|c| (c.shard_ref.to_string(), c.token.clone())).collect();
    let beat = scripts::extend(&mut env.con, &env.keys, "a", LONG_LOCK, &pairs, false, "0").await.unwrap();
    assert!(beat.lost.is_empty());
    assert_eq!(control::cancel(&mut env.con, &env.keys, "x").await.unwrap(), 2);
    let beat = scripts::extend(&mut env.con, &env.keys, "a", LONG_LOCK, &pairs, false, &beat.cancels).await.unwrap();
    let mut stopped: Vec<&str> = beat.cancelled.iter().map(|&i| pairs[i].0.as_str()).collect();
    stopped.sort();
    assert_eq!(stopped, ["x:1:0", "x:1:1"], "reported as cancelled");
    assert!(beat.lost.is_empty(), "a cancelled shard is not a lost lock: {:?}", beat.lost);
    assert_eq!(beat.cancels, "1");
    // the count seen: plain beats again, nothing lost
    let beat = scripts::extend(&mut env.con, &env.keys, "a", LONG_LOCK, &pairs[..0], false, &beat.cancels).await;
    let beat = beat.unwrap();
    assert!(beat.lost.is_empty() && beat.cancelled.is_empty(), "{beat:?}");
    // y runs on and completes; x's holders are refused
    let (x, y): (Vec<_>, Vec<_>) = held.iter().partition(|c| c.shard_ref.to_string().starts_with("x:"));
    assert_eq!(env.complete(x[0], "1").await, Err(ScriptCode::LockMissing));
    for c in y {
        assert_eq!(env.complete(c, "1").await, Ok(1));
    }
    assert_eq!(env.field("x", "state").await.as_deref(), Some("cancelled"));
    assert_eq!(env.field("y", "state").await.as_deref(), Some("aggregating"));
}

#[tokio::test]
async fn clean_older_than_removes_every_ended_task_over_several_batches() {
    let mut env = ScriptEnv::start("clean_batches").await;
    // 10 tasks with a short retention end first, then 250 kept forever
    let mut ids = Vec::new();
    for i in 0..260u64 {
        let mut spec = TaskSpec::new(format!("t{i}"), "noop", 1);
        spec.retain = if i < 10 { Some(Duration::from_secs(1)) } else { None };
        env.dispatch(&spec).await;
        let c = env.claim("a", i * 2, 1, LONG_LOCK).await.shards.remove(0);
        assert_eq!(env.complete(&c, "1").await, Ok(1));
        let agg = env.claim("a", i * 2 + 1, 1, LONG_LOCK).await.shards.remove(0);
        assert_eq!(env.complete(&agg, "{}").await, Ok(1));
        ids.push(spec.id);
    }
    env.dispatch(&TaskSpec::new("live", "noop", 1)).await;
    let finished: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.finished())).await;
    assert_eq!(finished, 260);
    // the 10 expired ones are both in `expiring` and among the oldest of `finished`
    let removed = control::clean(&mut env.con, &env.keys, Some(Duration::ZERO)).await.unwrap();
    assert_eq!(removed, 260, "every ended task goes, whatever the batches");
    let finished: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.finished())).await;
    let index: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.index()).arg(0).arg(-1)).await;
    assert_eq!((finished, index), (0, vec!["live".to_owned()]));
    let left: Vec<String> = env.cmd(redis::cmd("KEYS").arg(format!("{}task:t*", env.keys.prefix()))).await;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn stale_refs_of_a_cancelled_task_are_never_counted_by_a_new_task_under_its_id() {
    let mut env = ScriptEnv::start("reused_id").await;
    let mut spec = TaskSpec::new("x", "noop", 8);
    spec.retain = None;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 8, LONG_LOCK).await.shards;
    // shutdown released two of them to `wait`; then the task is cancelled and cleaned
    assert_eq!(env.release(&c[5]).await, Ok(1));
    assert_eq!(env.release(&c[6]).await, Ok(1));
    control::cancel(&mut env.con, &env.keys, "x").await.unwrap();
    assert_eq!(control::clean(&mut env.con, &env.keys, Some(Duration::ZERO)).await.unwrap(), 1);
    // the cancel took its queued refs out of its (short) lane; in a lane too long to filter
    // they stay for the claims to drop, as here
    assert!(env.wait_list().await.is_empty());
    let lane = env.keys.lane_wait("noop");
    env.cmd::<()>(redis::cmd("RPUSH").arg(&lane).arg("x:1:6").arg("x:1:5")).await;
    assert_eq!(env.wait_list().await, ["x:1:6", "x:1:5"], "queued refs are left for claims to drop");
    // the fixed task is dispatched again under the same id, with fewer shards
    env.dispatch(&TaskSpec::new("x", "noop", 3)).await;
    let got = env.claim("b", 0, 8, LONG_LOCK).await.shards;
    let refs: Vec<String> = got.iter().map(|c| c.shard_ref.to_string()).collect();
    assert_eq!(refs, ["x:2:0", "x:2:1", "x:2:2"], "the stale refs of the earlier task are dropped");
    for c in &got {
        assert_eq!(env.complete(c, "1").await, Ok(1));
    }
    assert_eq!((env.count("x", "done").await, env.count("x", "failed").await), (3, 0));
    assert_eq!(env.wait_list().await, ["x:2:agg"], "aggregation once every shard of the new task ran");
}

#[tokio::test]
async fn clean_leaves_a_new_task_under_an_id_whose_old_keys_expired() {
    let mut env = ScriptEnv::start("expired_id").await;
    let mut spec = TaskSpec::new("y", "noop", 1);
    spec.retain = Some(Duration::from_secs(60));
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 1, LONG_LOCK).await.shards;
    assert_eq!(env.complete(&c[0], "1").await, Ok(1));
    let agg = env.claim("a", 1, 1, LONG_LOCK).await.shards;
    assert_eq!(env.complete(&agg[0], "1").await, Ok(1));
    assert_eq!(env.field("y", "state").await.as_deref(), Some("completed"));
    // its keys expire (as their TTL would) before any clean ran, and the id is used again
    for k in env.keys.task_keys("y") {
        env.cmd::<()>(redis::cmd("DEL").arg(k)).await;
    }
    env.dispatch(&TaskSpec::new("y", "noop", 2)).await;
    assert_eq!(control::clean(&mut env.con, &env.keys, Some(Duration::ZERO)).await.unwrap(), 0);
    assert_eq!(env.field("y", "state").await.as_deref(), Some("running"), "the running task must stay");
    let index: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.index()).arg(0).arg(-1)).await;
    assert_eq!(index, ["y"]);
}

#[tokio::test]
async fn a_retry_while_the_aggregation_waits_out_its_backoff_leaves_one_aggregation_job() {
    let mut env = ScriptEnv::start("retry_agg_delayed").await;
    let mut spec = TaskSpec::new("z", "noop", 2);
    spec.attempts = 2;
    env.dispatch(&spec).await;
    let c = env.claim("a", 0, 2, LONG_LOCK).await.shards;
    assert_eq!(env.complete(&c[0], "1").await, Ok(1));
    assert_eq!(env.fail(&c[1], 0, "boom").await, Ok(2));
    let again = env.claim("a", 1, 1, LONG_LOCK).await.shards;
    assert_eq!(env.fail(&again[0], 0, "boom").await, Ok(1), "failed for good");
    let agg = env.claim("a", 2, 1, LONG_LOCK).await.shards;
    assert!(agg[0].shard_ref.is_aggregate());
    assert_eq!(env.fail(&agg[0], 60_000, "agg down").await, Ok(2), "the aggregation waits to retry");
    assert_eq!(shardctl_common::retry::retry(&mut env.con, &env.keys, "z").await.unwrap(), 1);
    let shard = env.claim("b", 0, 4, LONG_LOCK).await.shards;
    assert_eq!(shard.len(), 1);
    assert_eq!(env.complete(&shard[0], "1").await, Ok(1));
    // long past the old aggregation's backoff: one job only
    let aggs = env.claim("b", 1, 4, LONG_LOCK).await.shards;
    let refs: Vec<String> = aggs.iter().map(|c| c.shard_ref.to_string()).collect();
    assert_eq!(refs, ["z:1:agg"], "the aggregation is enqueued once");
}

#[tokio::test]
async fn a_cancelled_routed_task_places_nothing_more() {
    let mut env = ScriptEnv::start("route_cancelled").await;
    let spec = TaskSpec { strategy: shardctl_common::ring::Strategy::RoundRobin, ..TaskSpec::new("r", "noop", 4) };
    env.dispatch(&spec).await;
    control::cancel(&mut env.con, &env.keys, "r").await.unwrap();
    let r = scripts::route(&mut env.con, &env.keys, "r", 0, &["n1", "n2", "n1", "n2"]).await;
    assert!(matches!(r, Err(shardctl_common::Error::Script(ScriptCode::TaskEnded))), "{r:?}");
    let listed: Vec<String> = env.cmd(redis::cmd("LRANGE").arg(env.keys.node_wait("n1")).arg(0).arg(-1)).await;
    assert!(listed.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn the_rate_limit_logs_one_entry_per_claim_call_and_hands_out_exactly_the_rest() {
    let mut env = ScriptEnv::start("limit_log").await;
    env.dispatch(&TaskSpec::new("t", "noop", 100)).await;
    let limit = control::RateLimit { max: 10, per: Duration::from_secs(60) };
    control::set_limit(&mut env.con, &env.keys, Some(limit)).await.unwrap();
    let mut got = Vec::new();
    for seq in 0..3 {
        got.push(env.claim("a", seq, 4, LONG_LOCK).await.shards.len());
    }
    assert_eq!(got, [4, 4, 2], "ten starts in the window, then none");
    let full = env.claim("a", 3, 4, LONG_LOCK).await;
    assert!(full.shards.is_empty());
    let wait = full.next_due_in_ms.expect("how long until the window frees");
    assert!((59_000..=60_001).contains(&wait), "the oldest start leaves the window in about 60 s: {wait} ms");
    let log: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.limiter()).arg(0).arg(-1)).await;
    assert_eq!(log.len(), 3, "one entry per claim call, not per shard: {log:?}");
    assert_eq!(env.cmd::<Option<u64>>(redis::cmd("HGET").arg(env.keys.meta()).arg("limit_used")).await, Some(10));
    control::set_limit(&mut env.con, &env.keys, None).await.unwrap();
    assert_eq!(env.claim("a", 4, 4, LONG_LOCK).await.shards.len(), 4, "no limit any more");
    assert_eq!(env.cmd::<u64>(redis::cmd("EXISTS").arg(env.keys.limiter())).await, 0);
}

/// Under a rate limit the log counts starts: a claim takes only the shards its executor can start
/// at once, never those it wanted ahead of a free slot; with none startable it takes nothing and
/// says `busy` (the executor asks again when a slot frees). Without a limit, ahead is no matter.
#[tokio::test]
async fn under_a_rate_limit_nothing_is_claimed_ahead() {
    let mut env = ScriptEnv::start("limit_ahead").await;
    env.dispatch(&TaskSpec::new("t", "noop", 100)).await;
    let claim = |seq: u64, count: usize, ahead: usize| ClaimRequest {
        count,
        lock_ms: LONG_LOCK,
        instance: "a",
        seq,
        node: "n1",
        ahead,
        speeds: None,
        kinds: &shardctl_common::kinds::Served::Every,
    };
    let out = scripts::claim(&mut env.con, &env.keys, &claim(0, 8, 6)).await.unwrap();
    assert_eq!((out.shards.len(), out.busy), (8, false), "no limit: ahead is claimed too");
    let limit = control::RateLimit { max: 10, per: Duration::from_secs(60) };
    control::set_limit(&mut env.con, &env.keys, Some(limit)).await.unwrap();
    let out = scripts::claim(&mut env.con, &env.keys, &claim(1, 8, 6)).await.unwrap();
    assert_eq!((out.shards.len(), out.busy), (2, false), "only the two startable at once");
    let out = scripts::claim(&mut env.con, &env.keys, &claim(2, 8, 8)).await.unwrap();
    assert_eq!((out.shards.len(), out.busy, out.next_due_in_ms), (0, true, None), "none startable: busy");
    let used: Option<u64> = env.cmd(redis::cmd("HGET").arg(env.keys.meta()).arg("limit_used")).await;
    assert_eq!(used, Some(2), "the log counts the two started");
}
