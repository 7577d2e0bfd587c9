//! Regressions from a correctness review of the Lua scripts and their Rust callers, each a test
//! against a real redis-server.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_common::model::TaskSpec;
use shardctl_common::scripts;
use support::ScriptEnv;

const LONG_LOCK: u64 = 60_000;

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Regression: a task could have more shards than the terminal bitmap addresses (2^32); a
/// completion batch holding an index past it raised an error after `complete.lua` had already
/// taken the batch out of `active` (scripts roll nothing back), losing every shard of the batch.
/// Now such a task is refused at validation and again by `dispatch.lua`.
#[tokio::test]
async fn a_task_past_the_bitmap_is_refused() {
    let mut env = ScriptEnv::start("review_bitmap").await;
    let too_many = TaskSpec::new("big", "noop", (1u64 << 32) + 1);
    assert!(too_many.validate().unwrap_err().to_string().contains("2^32"));
    let r = scripts::dispatch(&mut env.con, &env.keys, &too_many).await;
    let e = r.expect_err("dispatch.lua must refuse it too");
    assert!(matches!(e, shardctl_common::Error::Script(shardctl_common::ScriptCode::InvalidSpec)), "{e}");
    assert!(TaskSpec::new("max", "noop", 1u64 << 32).validate().is_ok());
    let mut loud = TaskSpec::new("p", "noop", 1);
    loud.priority = 1_000_001;
    assert!(loud.validate().is_err());
}

/// Regression: dispatch.lua ordered runnable tasks by `-priority * 1e12 + seq`, a double. Past
/// |priority| ~ 9,000 the sum exceeds 2^53 and `seq` vanishes, so tasks of equal priority are no
/// longer run in submission order (the zset falls back to comparing the ids).
#[tokio::test]
async fn equal_high_priorities_keep_submission_order() {
    let mut env = ScriptEnv::start("review_priority").await;
    let mut first = TaskSpec::new("second-by-name", "noop", 1);
    first.priority = 1_000_000;
    let mut then = TaskSpec::new("a-first-by-name", "noop", 1);
    then.priority = 1_000_000;
    env.dispatch(&first).await;
    env.dispatch(&then).await;
    let c = env.claim("ex", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(c.shard_ref.task, "second-by-name", "first dispatched should run first among equal priorities");
}

/// A claim that re-takes a lapsed lease says so only in its reply; when that reply is lost the
/// executor cannot know, so after any failed claim call it must beat in `check` mode (the
/// executor's claim loop sets `must_check` on every claim error). A plain beat cannot see it.
#[tokio::test]
async fn after_a_lost_lapsed_claim_reply_a_checked_beat_reports_the_lost_shard() {
    let mut env = ScriptEnv::start("review_lost_lapse").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    let lost_one = env.claim("ex", 1, 1, 100).await.shards.remove(0);
    sleep_ms(200).await;
    assert_eq!(env.sweep(50, 5).await.map(|s| s.recovered), Some(1));
    let other = env.claim("other", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(other.shard_ref, lost_one.shard_ref);
    // the executor wakes; its claim runs but the reply never arrives (lapsed flag lost)
    let _lost_reply = env.claim("ex", 2, 1, LONG_LOCK).await;
    assert_eq!(env.extend("ex", &[&lost_one], LONG_LOCK).await, Vec::<usize>::new(), "a plain beat cannot see it");
    let lost = env.extend_checked("ex", &[&lost_one], LONG_LOCK, true).await;
    assert_eq!(lost, [0], "the shard another executor holds must be reported lost");
}

/// Regression: disown.lua gave a ref back without removing it from the `stalled` candidates
/// (release/complete/fail all SREM it). A ref that the sweep marked while its (lost-reply) claim's
/// lease entry was gone keeps that mark after it is given back, so its *next* holder is recovered
/// by the very next full sweep, without the mark-then-confirm grace of one interval.
#[tokio::test]
async fn a_disowned_ref_does_not_keep_its_stall_mark() {
    let mut env = ScriptEnv::start("review_disown_mark").await;
    env.dispatch(&TaskSpec::new("t", "noop", 3)).await;
    // claim whose reply was lost: ex never learns it holds t:0
    let orphan = env.claim("ex", 1, 1, LONG_LOCK).await.shards.remove(0);
    env.remove_lease("ex").await;
    assert_eq!(env.sweep(50, 5).await.map(|s| s.marked), Some(1), "ex's lease entry vanished: t:0 marked");
    // ex comes back: a claim re-takes its lease, its reconcile gives the orphan back
    let _ = env.claim("ex", 2, 1, LONG_LOCK).await;
    let pairs = [(orphan.shard_ref.to_string(), orphan.token.clone())];
    assert_eq!(scripts::disown(&mut env.con, &env.keys, &pairs).await.unwrap(), 1);
    // another executor takes it; its lease entry vanishes too
    let next = env.claim("f", 1, 1, LONG_LOCK).await.shards.remove(0);
    assert_eq!(next.shard_ref, orphan.shard_ref);
    env.remove_lease("f").await;
    let r = env.sweep_after(50, 5).await;
    assert_eq!(r.recovered, 0, "f's shard was recovered without ever being marked: {r:?}");
}

/// The reporter drops a batch only on errors raised inside a script (they repeat on every retry);
/// outages, a loading or full Redis are retried.
#[tokio::test]
async fn script_errors_are_told_from_outages() {
    let mut env = ScriptEnv::start("review_script_error").await;
    let r: redis::RedisResult<()> = redis::cmd("EVAL")
        .arg("return redis.call('BITFIELD', KEYS[1], 'SET', 'u1', 'x', 1)")
        .arg(1)
        .arg("k")
        .query_async(&mut env.con)
        .await;
    let e = shardctl_common::Error::from(r.unwrap_err());
    assert!(e.is_script_error(), "{e}");
    assert!(!e.is_retryable());
    let down = shardctl_common::conn::open("redis://127.0.0.1:1").unwrap().manager().await;
    assert!(!down.err().is_some_and(|e| e.is_script_error()));
}
