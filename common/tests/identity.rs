//! Task incarnations (docs/design/identity.md): nothing of an earlier task under the same id
//! (its queued refs, its held refs, its per-shard state, its terminal bits) is ever taken for the
//! current one. Each test is a regression of issue 11 that failed before refs carried their
//! incarnation, against a real redis-server.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::collections::HashSet;
use std::time::Duration;

use shardctl_common::control;
use shardctl_common::model::{Job, TaskSpec};
use shardctl_common::ScriptCode;
use support::ScriptEnv;

const LONG_LOCK: u64 = 60_000;

fn spec(id: &str, shards: u64, attempts: u32) -> TaskSpec {
    let mut s = TaskSpec::new(id, "noop", shards);
    s.attempts = attempts;
    s.retain = None;
    s
}

/// Defect 2: refs of a cancelled and cleaned task, left queued in `wait` (released) and in
/// `delayed` (a retry), with per-shard state (fails, attempts), became shards of the next task
/// under the id: one claim returned the same ref twice under one token, and old failure counts
/// shortened the new shard's attempts.
#[tokio::test]
async fn leftovers_of_a_cleaned_task_never_become_the_new_tasks_shards() {
    let mut env = ScriptEnv::start("identity_leftovers").await;
    env.dispatch(&spec("x", 8, 2)).await;
    let c = env.claim("a", 0, 8, LONG_LOCK).await.shards;
    assert_eq!(c.len(), 8);
    // queued refs below the next task's total: released to `wait`, one failed once (state
    // `fails` = 1, waiting out its backoff, then due)
    assert_eq!(env.release(&c[1]).await, Ok(1));
    assert_eq!(env.release(&c[5]).await, Ok(1));
    assert_eq!(env.fail(&c[2], 0, "boom").await, Ok(2));
    // the rest stays held by executor a, which goes on running them
    control::cancel(&mut env.con, &env.keys, "x").await.unwrap();
    assert_eq!(control::clean(&mut env.con, &env.keys, Some(Duration::ZERO)).await.unwrap(), 1);
    let left: Vec<String> = env.cmd(redis::cmd("KEYS").arg(format!("{}task:x*", env.keys.prefix()))).await;
    assert!(left.is_empty(), "a cleaned task leaves no key: {left:?}");
    // the stale refs are put back in `wait` too, as a recovery or a lost release would
    for r in ["x:1:2", "x:1:3", "x:1:agg"] {
        env.cmd::<()>(redis::cmd("RPUSH").arg(env.keys.lane_wait("noop")).arg(r)).await;
    }

    // the same id again, with as many shards and one attempt each
    env.dispatch(&spec("x", 8, 1)).await;
    let inc: u64 = env.field("x", "seq").await.unwrap().parse().unwrap();
    assert_eq!(inc, 2);
    let got = env.claim("b", 0, 20, LONG_LOCK).await.shards;
    let mut seen = HashSet::new();
    for g in &got {
        assert_eq!(g.shard_ref.seq, inc, "a ref of the earlier task was handed out: {g:?}");
        assert!(seen.insert(g.shard_ref.to_string()), "one claim handed out {} twice", g.shard_ref);
        assert_eq!((g.attempt, g.fails), (1, 0), "the earlier task's state leaked into {}", g.shard_ref);
    }
    assert_eq!(got.len(), 8, "each shard of the new task exactly once: {got:?}");
    // the earlier task's holder finishes late: refused, nothing counted
    assert_eq!(env.complete(&c[0], "\"old\"").await, Err(ScriptCode::LockMissing));
    // the new task fails one shard with its only attempt: failed for good, counted once
    assert_eq!(env.fail(&got[0], 0, "new failure").await, Ok(1));
    for g in &got[1..] {
        assert_eq!(env.complete(g, "1").await, Ok(1));
    }
    assert_eq!((env.count("x", "done").await, env.count("x", "failed").await), (7, 1));
    let agg = env.claim("b", 1, 20, LONG_LOCK).await.shards;
    assert_eq!(agg.len(), 1, "one aggregation job, of the new task: {agg:?}");
    assert_eq!((agg[0].shard_ref.job, agg[0].shard_ref.seq), (Job::Aggregate, inc));
}

/// Defect 2, second half: a stale ref whose string equals one already held must never take the
/// shard from its holder (`HSET active` overwrote it).
#[tokio::test]
async fn a_claim_never_takes_a_held_shard_from_its_holder() {
    let mut env = ScriptEnv::start("identity_held").await;
    env.dispatch(&spec("t", 2, 1)).await;
    let held = env.claim("a", 0, 1, LONG_LOCK).await.shards.remove(0);
    let r = held.shard_ref.to_string();
    // the same ref queued twice (as a lost reply's retry or a bug might leave it)
    for _ in 0..2 {
        env.cmd::<()>(redis::cmd("LPUSH").arg(env.keys.lane_wait("noop")).arg(&r)).await;
    }
    let got = env.claim("b", 0, 10, LONG_LOCK).await.shards;
    let refs: Vec<String> = got.iter().map(|c| c.shard_ref.to_string()).collect();
    assert_eq!(refs, ["t:1:1"], "the held ref is not handed out again");
    assert_eq!(env.holder(&r).await.as_deref(), Some(held.token.as_str()), "its holder keeps it");
    assert_eq!(env.complete(&held, "1").await, Ok(1));
}

/// Defect 6 (`complete.lua` never checked `idx < total`): a completion of an index past the
/// task's total must count nothing and leave the bitmap alone.
#[tokio::test]
async fn a_completion_past_the_total_counts_nothing() {
    let mut env = ScriptEnv::start("identity_past_total").await;
    env.dispatch(&spec("t", 2, 1)).await;
    let mut c = env.claim("a", 0, 1, LONG_LOCK).await.shards.remove(0);
    // forge a hold of shard 5 of this incarnation under the claim's token
    c.shard_ref.job = Job::Shard(5);
    env.set_holder(&c.shard_ref.to_string(), &c.token).await;
    assert_eq!(env.complete(&c, "1").await, Err(ScriptCode::TaskMissing));
    assert_eq!(env.count("t", "done").await, 0);
    let bits: Option<Vec<u8>> = env.cmd(redis::cmd("GET").arg(env.keys.terminal("t"))).await;
    assert!(bits.unwrap_or_default().iter().all(|b| *b == 0), "no terminal bit was set");
    assert!(env.holder(&c.shard_ref.to_string()).await.is_none(), "the forged hold is let go");
}

/// A dispatch under an id whose earlier keys were left behind (an expiry that took the task hash
/// first, or an abort part-way) starts clean: no terminal bit, result or reason of the old task.
#[tokio::test]
async fn a_new_incarnation_starts_from_clean_keys() {
    let mut env = ScriptEnv::start("identity_clean_start").await;
    for (k, f, v) in [(env.keys.results("x"), "0", "\"old\""), (env.keys.errors("x"), "1", "old reason")] {
        env.cmd::<()>(redis::cmd("HSET").arg(k).arg(f).arg(v)).await;
    }
    env.cmd::<()>(redis::cmd("SETBIT").arg(env.keys.terminal("x")).arg(0).arg(1)).await;
    env.cmd::<()>(redis::cmd("HSET").arg(env.keys.shards("x")).arg("0:fails").arg(5)).await;
    env.dispatch(&spec("x", 1, 1)).await;
    let c = env.claim("a", 0, 1, LONG_LOCK).await.shards;
    assert_eq!(c.len(), 1, "shard 0 is not terminal in the new task");
    assert_eq!((c[0].attempt, c[0].fails), (1, 0));
    assert_eq!(env.complete(&c[0], "\"new\"").await, Ok(1));
    let r: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.results("x")).arg(0)).await;
    assert_eq!(r.as_deref(), Some("\"new\""));
    let e: u64 = env.cmd(redis::cmd("HLEN").arg(env.keys.errors("x"))).await;
    assert_eq!(e, 0, "no reason of the earlier task is left");
}
