//! Backup attempts for stragglers (docs/design/speculation.md) at the level of the scripts,
//! against a real redis-server: a shard of a task with `--speculate` held past the task's
//! threshold gets a second attempt on another executor once nothing else is left to run; the
//! first to finish counts, once, and the other is refused and told it was stopped; never on the
//! original's executor; a crash, a failure to retry or a release of either attempt loses
//! nothing and requeues nothing while the other runs; a permanent failure is the shard's
//! verdict; the cap holds; a backup runs only where its kind is served; a cancel stops both.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_common::failure::{Failure, Threshold};
use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{ClaimRequest, Claimed};
use support::{index, ScriptEnv};

const LOCK: u64 = 60_000;
/// Past the threshold's floor (500 ms) for shards measured at about a millisecond.
const STRAGGLE: Duration = Duration::from_millis(650);

async fn backups(env: &mut ScriptEnv) -> std::collections::HashMap<String, String> {
    let key = env.keys.backups();
    env.cmd(redis::cmd("HGETALL").arg(key)).await
}

/// Task `t` of `shards` shards with `--speculate cap`, all claimed by executor `a`, all but the
/// last completed at once (measured at about a millisecond each): the last straggles.
async fn straggler(env: &mut ScriptEnv, shards: u64, cap: u64) -> Vec<Claimed> {
    env.dispatch(&TaskSpec { speculate: Some(Threshold::Count(cap)), ..TaskSpec::new("t", "noop", shards) }).await;
    let held = env.claim("a", 1, shards as usize, LOCK).await.shards;
    assert_eq!(held.len() as u64, shards);
    let (done, rest) = held.split_at(held.len() - 1);
    for c in done {
        assert_eq!(env.complete(c, "").await, Ok(1));
    }
    rest.to_vec()
}

#[tokio::test]
async fn the_first_attempt_to_finish_counts_once_and_the_other_is_refused() {
    let mut env = ScriptEnv::start("spec_wins").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    // too early: nothing yet, but the claim says when to ask again
    let early = env.claim("b", 1, 4, LOCK).await;
    assert!(early.shards.is_empty());
    assert!(early.next_due_in_ms.is_some_and(|ms| ms <= 500), "{:?}", early.next_due_in_ms);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 2, 4, LOCK).await.shards;
    assert_eq!(backup.len(), 1, "one backup, of the straggler");
    assert_eq!((backup[0].shard_ref.to_string(), backup[0].attempt), (original.shard_ref.to_string(), 1));
    assert_eq!(backups(&mut env).await.len(), 1);
    assert_eq!(env.count("t", "spec_started").await, 1);
    let started = env.events("shard_speculated").await;
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].get("shard").map(String::as_str), Some("9"));
    // the backup finishes first: counted once; the first attempt is refused, and its heartbeat
    // says it was stopped, not lost
    assert_eq!(env.complete(&backup[0], "").await, Ok(1));
    assert_eq!(env.complete(&original, "").await, Err(shardctl_common::ScriptCode::LockMissing));
    assert_eq!(env.count("t", "done").await, 10);
    assert_eq!(env.count("t", "spec_won").await, 1);
    let won = env.events("speculation_won").await;
    assert_eq!(won[0].get("attempt").map(String::as_str), Some("backup"));
    let key = env.keys.clone();
    let beat = shardctl_common::scripts::extend(
        &mut env.con,
        &key,
        "a",
        LOCK,
        &[(original.shard_ref.to_string(), original.token.clone())],
        true,
        "0",
    )
    .await
    .unwrap();
    assert_eq!((beat.lost.len(), beat.cancelled.clone()), (0, vec![0]), "{beat:?}");
    assert!(backups(&mut env).await.is_empty());
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
}

#[tokio::test]
async fn a_backup_never_runs_on_its_originals_executor_and_the_cap_holds() {
    let mut env = ScriptEnv::start("spec_where").await;
    env.dispatch(&TaskSpec { speculate: Some(Threshold::Count(1)), ..TaskSpec::new("t", "noop", 12) }).await;
    let held = env.claim("a", 1, 12, LOCK).await.shards;
    for c in &held[..10] {
        assert_eq!(env.complete(c, "").await, Ok(1));
    }
    tokio::time::sleep(STRAGGLE).await;
    // its own executor gets none, nor one serving only another kind
    assert!(env.claim("a", 2, 4, LOCK).await.shards.is_empty());
    let other = Served::only(["other"]).unwrap();
    let req = ClaimRequest {
        count: 4,
        lock_ms: LOCK,
        instance: "d",
        seq: 1,
        node: "n",
        ahead: 0,
        speeds: None,
        kinds: &other,
    };
    let key = env.keys.clone();
    let got = shardctl_common::scripts::claim(&mut env.con, &key, &req).await.unwrap();
    assert!(got.shards.is_empty(), "a backup of a `noop` shard for an executor serving `other`: {:?}", got.shards);
    // another gets one: the cap is 1 though two straggle
    let b = env.claim("b", 1, 4, LOCK).await.shards;
    assert_eq!(b.len(), 1);
    assert!(env.claim("c", 1, 4, LOCK).await.shards.is_empty(), "the cap holds");
    // the first attempt wins this time: the backup is refused, told it was stopped
    let first = held.iter().find(|c| c.shard_ref == b[0].shard_ref).unwrap();
    assert_eq!(env.complete(first, "").await, Ok(1));
    assert_eq!(env.complete(&b[0], "").await, Err(shardctl_common::ScriptCode::LockMissing));
    let won = env.events("speculation_won").await;
    assert_eq!(won[0].get("attempt").map(String::as_str), Some("first"));
    assert_eq!(env.count("t", "spec_won").await, 0);
}

#[tokio::test]
async fn a_crash_of_either_attempts_executor_loses_nothing_and_requeues_nothing() {
    let mut env = ScriptEnv::start("spec_crash").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    // the original's executor dies: its backup takes its place, nothing is requeued
    env.drop_lease("a").await;
    let swept = env.sweep(60_000, 1).await.expect("a lease expired");
    assert_eq!(swept.recovered, 0);
    assert_eq!(env.holder(&original.shard_ref.to_string()).await, Some(backup.token.clone()));
    assert!(backups(&mut env).await.is_empty());
    assert!(env.wait_list().await.is_empty(), "nothing requeued");
    assert_eq!(env.complete(&backup, "").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 10);

    // the other way: the backup's executor dies, the first attempt runs on
    let mut env = ScriptEnv::start("spec_crash_backup").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    env.drop_lease("b").await;
    env.sweep(60_000, 1).await.expect("a lease expired");
    assert!(backups(&mut env).await.is_empty());
    assert_eq!(env.holder(&original.shard_ref.to_string()).await, Some(original.token.clone()));
    // (the shard is held, by another token)
    assert_eq!(env.complete(&backup, "").await, Err(shardctl_common::ScriptCode::LockMismatch));
    assert_eq!(env.complete(&original, "").await, Ok(1));
}

#[tokio::test]
async fn a_failure_to_retry_or_a_release_drops_one_attempt_a_permanent_one_is_the_verdict() {
    // the first attempt fails (to be retried): its backup takes its place, nothing is retried
    let mut env = ScriptEnv::start("spec_fail").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    assert_eq!(env.fail(&original, 0, "flaky").await, Ok(2));
    assert_eq!(env.holder(&original.shard_ref.to_string()).await, Some(backup.token.clone()));
    let delayed: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.delayed())).await;
    assert_eq!((delayed, env.count("t", "failed").await), (0, 0));
    assert_eq!(env.complete(&backup, "").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 10);

    // the backup is released: the first attempt runs on
    let mut env = ScriptEnv::start("spec_release").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    assert_eq!(env.release(&backup).await, Ok(1));
    assert!(backups(&mut env).await.is_empty() && env.wait_list().await.is_empty());
    // (a shard gets one backup, ever)
    tokio::time::sleep(STRAGGLE).await;
    assert!(env.claim("c", 1, 4, LOCK).await.shards.is_empty());
    assert_eq!(env.complete(&original, "").await, Ok(1));

    // the backup fails for good: the shard's verdict; the first attempt is refused
    let mut env = ScriptEnv::start("spec_permanent").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    assert_eq!(env.fail_as(&backup, 0, "bad row", Failure::Permanent).await, Ok(1));
    assert_eq!(env.count("t", "failed").await, 1);
    assert_eq!(env.complete(&original, "").await, Err(shardctl_common::ScriptCode::LockMissing));
    assert!(backups(&mut env).await.is_empty());
    assert_eq!(index(&original), 9);
}

#[tokio::test]
async fn a_cancel_stops_both_attempts() {
    let mut env = ScriptEnv::start("spec_cancel").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    let key = env.keys.clone();
    shardctl_common::control::cancel_in(&mut env.con, &key, "t").await.unwrap();
    assert!(backups(&mut env).await.is_empty());
    assert_eq!(env.complete(&backup, "").await, Err(shardctl_common::ScriptCode::LockMissing));
    assert_eq!(env.complete(&original, "").await, Err(shardctl_common::ScriptCode::LockMissing));
}

#[tokio::test]
async fn a_capped_task_gets_no_backup_and_a_lost_reply_hands_the_shard_to_its_backup() {
    // a task with --max-running: no backup, however long a shard straggles
    let mut env = ScriptEnv::start("spec_capped").await;
    env.dispatch(&TaskSpec {
        speculate: Some(Threshold::Count(3)),
        max_running: Some(50),
        ..TaskSpec::new("t", "noop", 10)
    })
    .await;
    let held = env.claim("a", 1, 10, LOCK).await.shards;
    for c in &held[..9] {
        assert_eq!(env.complete(c, "").await, Ok(1));
    }
    tokio::time::sleep(STRAGGLE).await;
    assert!(env.claim("b", 1, 4, LOCK).await.shards.is_empty(), "a capped task gets no backup");

    // the first attempt's claim reply was lost: its executor gives it back (disown), and its
    // backup takes its place; nothing is requeued, the held count stays
    let mut env = ScriptEnv::start("spec_disown").await;
    let original = straggler(&mut env, 10, 3).await.remove(0);
    tokio::time::sleep(STRAGGLE).await;
    let backup = env.claim("b", 1, 4, LOCK).await.shards.remove(0);
    let key = env.keys.clone();
    let pairs = [(original.shard_ref.to_string(), original.token.clone())];
    assert_eq!(shardctl_common::scripts::disown(&mut env.con, &key, &pairs).await.unwrap(), 1);
    assert_eq!(env.holder(&original.shard_ref.to_string()).await, Some(backup.token.clone()));
    assert!(env.wait_list().await.is_empty() && backups(&mut env).await.is_empty());
    let held: Option<u64> = env.cmd(redis::cmd("HGET").arg(env.keys.held()).arg("t")).await;
    assert_eq!(held, Some(1), "the shard is held once, by its backup");
    assert_eq!(env.complete(&backup, "").await, Ok(1));
    assert_eq!(env.count("t", "done").await, 10);
}
