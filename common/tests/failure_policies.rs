//! Failures a handler classifies and fail-fast (docs/design/failure-policies.md) at the level of
//! the scripts, against a real redis-server: a permanent failure is terminal at once, a
//! retry-after is due after its own delay and uses no attempt, a fail-task halts the task, a
//! task past its `max_failures` halts (by `fail.lua` or by the sweep's stalls): nothing of it is
//! claimed again, its running shards lose their locks, it never aggregates; `retry` then runs
//! exactly its failed and unfinished shards, and it completes.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_common::failure::{Failure, Threshold};
use shardctl_common::model::TaskSpec;
use support::{index, ScriptEnv};

const LOCK: u64 = 60_000;

#[tokio::test]
async fn a_permanent_failure_is_terminal_at_its_first_attempt() {
    let mut env = ScriptEnv::start("fp_permanent").await;
    env.dispatch(&TaskSpec { attempts: 5, ..TaskSpec::new("t", "noop", 3) }).await;
    let c = env.claim("ex", 1, 3, LOCK).await.shards;
    assert_eq!(env.fail_as(&c[0], 60_000, "ValueError: bad row 17", Failure::Permanent).await, Ok(1));
    assert_eq!(env.count("t", "failed").await, 1);
    assert_eq!(env.field("t", "first_failure").await.as_deref(), Some("0 ValueError: bad row 17"));
    // nothing waits for a retry
    let delayed: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.delayed())).await;
    assert_eq!(delayed, 0);
    // a plain failure beside it is retried
    assert_eq!(env.fail(&c[1], 60_000, "flaky").await, Ok(2));
    for s in &c[2..] {
        assert_eq!(env.complete(s, "").await, Ok(1));
    }
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
}

#[tokio::test]
async fn a_retry_after_is_due_after_its_delay_and_uses_no_attempt() {
    let mut env = ScriptEnv::start("fp_after").await;
    env.dispatch(&TaskSpec { attempts: 2, ..TaskSpec::new("t", "noop", 1) }).await;
    let mut attempt_fails = Vec::new();
    // five deferrals of a shard with 2 attempts: none uses one
    for seq in 1..=5 {
        let c = env.claim("ex", seq, 1, LOCK).await;
        let c = match c.shards.first() {
            Some(c) => c.clone(),
            None => {
                // not due yet: the claim says when, on the server's clock
                let due = c.next_due_in_ms.expect("a due time");
                assert!(due <= 150, "due in {due} ms");
                tokio::time::sleep(Duration::from_millis(due + 5)).await;
                env.claim("ex", seq + 100, 1, LOCK).await.shards[0].clone()
            }
        };
        attempt_fails.push(c.fails);
        let code = env.fail_as(&c, 120, "429: slow down", Failure::RetryAfter(Duration::from_millis(120))).await;
        assert_eq!(code, Ok(2));
        let key = env.keys.delayed();
        let due: Option<f64> = env.cmd(redis::cmd("ZSCORE").arg(key).arg(c.shard_ref.to_string())).await;
        let now: Vec<String> = env.cmd(&redis::cmd("TIME")).await;
        let now_ms = now[0].parse::<f64>().unwrap() * 1000.0 + now[1].parse::<f64>().unwrap() / 1000.0;
        let left = due.expect("in delayed") - now_ms;
        assert!((60.0..=121.0).contains(&left), "due in {left} ms");
        // not claimable before its time
        assert!(env.claim("ex", seq + 1000, 1, LOCK).await.shards.is_empty());
    }
    assert_eq!(attempt_fails, vec![0; 5], "a deferral counts no failure");
    assert_eq!(env.events("shard_deferred").await.len(), 5);
    assert_eq!(env.count("t", "failed").await, 0);
}

#[tokio::test]
async fn a_fail_task_halts_the_task_and_stops_its_running_shards() {
    let mut env = ScriptEnv::start("fp_fail_task").await;
    env.dispatch(&TaskSpec::new("t", "noop", 10)).await;
    env.dispatch(&TaskSpec::new("other", "noop", 2)).await;
    let c = env.claim("ex", 1, 8, LOCK).await.shards;
    let (mine, theirs): (Vec<_>, Vec<_>) = c.iter().partition(|c| c.shard_ref.task == "t");
    // one shard of t waits out a backoff
    assert_eq!(env.fail(mine[1], 60_000, "flaky").await, Ok(2));
    let cancels_before = env.cmd::<Option<u64>>(redis::cmd("HGET").arg(env.keys.meta()).arg("cancels")).await;
    let code = env.fail_as(mine[0], 0, "KeyError: API_TOKEN\n", Failure::FailTask).await;
    assert_eq!(code, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("failed"));
    let halted = env.field("t", "halted").await.unwrap();
    let i = index(mine[0]);
    assert_eq!(halted, format!("failed by its handler: shard {i} asked to fail the task: KeyError: API_TOKEN"));
    // its other shards are not held any more; the other task's are
    let active = env.active().await;
    assert!(active.iter().all(|r| !r.starts_with("t:")), "{active:?}");
    assert_eq!(active.len(), theirs.len());
    let cancels = env.cmd::<Option<u64>>(redis::cmd("HGET").arg(env.keys.meta()).arg("cancels")).await;
    assert!(cancels > cancels_before, "executors learn of the stop from `cancels`");
    // its retry left `delayed`; no claim takes anything of it again
    let delayed: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.delayed()).arg(0).arg(-1)).await;
    assert!(delayed.iter().all(|r| !r.starts_with("t:")), "{delayed:?}");
    let next = env.claim("ex", 2, 100, LOCK).await.shards;
    assert!(next.iter().all(|c| c.shard_ref.task != "t"), "{next:?}");
    // an outcome of a stopped shard is refused
    assert!(env.complete(mine[2], "").await.is_err());
    assert_eq!(env.events("task_halted").await.len(), 1);
    assert!(env.events("task_aggregating").await.iter().all(|e| e["task"] != "t"));
}

#[tokio::test]
async fn past_max_failures_the_task_halts_and_retry_runs_the_failed_and_unfinished() {
    let mut env = ScriptEnv::start("fp_fast").await;
    let spec = TaskSpec { max_failures: Some(Threshold::Count(2)), ..TaskSpec::new("t", "noop", 20) };
    env.dispatch(&spec).await;
    assert_eq!(env.count("t", "max_failures").await, 2);
    let c = env.claim("ex", 1, 8, LOCK).await.shards;
    for s in &c[..3] {
        assert_eq!(env.complete(s, "").await, Ok(1));
    }
    for s in &c[3..5] {
        assert_eq!(env.fail_as(s, 0, "bad input", Failure::Permanent).await, Ok(1));
    }
    // two failed for good: at the limit, not past it
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
    assert_eq!(
        env.fail_as(
            &c[5],
            0,
            "Traceback (most recent call last):\n  File \"w.py\"\nValueError: row 9",
            Failure::Permanent
        )
        .await,
        Ok(1)
    );
    assert_eq!(env.field("t", "state").await.as_deref(), Some("failed"));
    let halted = env.field("t", "halted").await.unwrap();
    let first = index(&c[3]);
    assert_eq!(
        halted,
        format!("failed fast: 3 of 20 shards failed for good (limit 2); first: shard {first} bad input")
    );
    // two shards were running (stopped), twelve never handed out
    assert!(env.active().await.is_empty());
    assert!(env.claim("ex", 2, 20, LOCK).await.shards.is_empty());
    assert_eq!(env.field("t", "result").await, None);

    // retry: the 3 failed and the 2 stopped run again, then the 12 never handed out
    let again = shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await.unwrap();
    assert_eq!(again, 5);
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
    assert_eq!(env.field("t", "halted").await, None);
    assert_eq!(env.count("t", "failed").await, 0);
    let mut seen = std::collections::BTreeSet::new();
    let mut agg = None;
    for seq in 3..20 {
        let c = env.claim("ex", seq, 4, LOCK).await.shards;
        if c.is_empty() {
            break;
        }
        for s in &c {
            if s.shard_ref.is_aggregate() {
                // every shard terminal: it aggregates
                agg = Some(s.clone());
                continue;
            }
            assert!(seen.insert(index(s)), "shard {} handed out twice", index(s));
            assert_eq!(env.complete(s, "").await, Ok(1));
        }
    }
    let done: Vec<u64> = c[..3].iter().map(index).collect();
    assert_eq!(seen.len(), 17, "every shard not completed before runs once: {seen:?}");
    assert!(done.iter().all(|i| !seen.contains(i)));
    let agg = match agg {
        Some(a) => a,
        None => env.claim("ex", 50, 1, LOCK).await.shards[0].clone(),
    };
    assert!(agg.shard_ref.is_aggregate());
    assert_eq!(env.complete(&agg, "{}").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("completed"));
}

#[tokio::test]
async fn stalls_past_the_limit_halt_the_task_in_the_sweep() {
    let mut env = ScriptEnv::start("fp_sweep").await;
    let spec = TaskSpec { max_failures: Some(Threshold::Count(0)), ..TaskSpec::new("t", "noop", 4) };
    env.dispatch(&spec).await;
    let c = env.claim("dead", 1, 1, LOCK).await.shards;
    env.drop_lease("dead").await;
    // max_stalled 0: the first stall fails the shard for good, past a limit of 0
    let r = env.sweep(60_000, 0).await.expect("a sweep ran");
    assert_eq!(r.failed, 1);
    assert_eq!(env.field("t", "state").await.as_deref(), Some("failed"));
    let halted = env.field("t", "halted").await.unwrap();
    assert!(halted.starts_with("failed fast: 1 of 4 shards failed for good (limit 0); first: shard 0"), "{halted}");
    assert_eq!(index(&c[0]), 0);
    assert!(env.claim("ex", 2, 4, LOCK).await.shards.is_empty());
    // held counts of the task are gone with it
    let held: Option<String> = env.cmd(redis::cmd("HGET").arg(env.keys.held()).arg("t")).await;
    assert_eq!(held, None);
}

#[tokio::test]
async fn a_cancel_takes_its_due_retries_out_of_the_lane_at_once() {
    let mut env = ScriptEnv::start("fp_cancel_due").await;
    env.dispatch(&TaskSpec::new("t", "noop", 4)).await;
    env.dispatch(&TaskSpec::new("u", "noop", 1)).await;
    let c = env.claim("ex", 1, 5, LOCK).await.shards;
    for s in &c {
        assert_eq!(env.fail(s, 0, "flaky").await, Ok(2));
    }
    // a claim of another kind promotes the due retries into noop's lane, taking none
    let other = shardctl_common::kinds::Served::Only(vec!["other".into()]);
    let req = shardctl_common::scripts::ClaimRequest {
        count: 1,
        lock_ms: LOCK,
        instance: "ex",
        seq: 2,
        node: "n1",
        ahead: 0,
        speeds: None,
        kinds: &other,
    };
    assert!(shardctl_common::scripts::claim(&mut env.con, &env.keys, &req).await.unwrap().shards.is_empty());
    assert_eq!(env.wait_list().await.len(), 5);
    shardctl_common::control::cancel(&mut env.con, &env.keys, "t").await.unwrap();
    // the waiting count is exact at once: only u's retry waits
    assert_eq!(env.wait_list().await, vec!["u:2:0".to_owned()]);
}

#[tokio::test]
async fn a_retry_after_a_halt_numbers_past_every_attempt_a_handler_saw() {
    let mut env = ScriptEnv::start("fp_attempts").await;
    let spec = TaskSpec { attempts: 1, max_failures: Some(Threshold::Count(0)), ..TaskSpec::new("t", "noop", 2) };
    env.dispatch(&spec).await;
    let c = env.claim("ex", 1, 2, LOCK).await.shards;
    let (a, b) = (c[0].clone(), c[1].clone());
    // shard b ran twice, given back at shutdowns (attempts 1 and 2 seen by its handlers)
    assert_eq!(env.release(&b).await, Ok(1));
    let b2 = env.claim("ex", 2, 1, LOCK).await.shards[0].clone();
    assert_eq!((b2.shard_ref.clone(), b2.attempt), (b.shard_ref.clone(), 2));
    assert_eq!(env.release(&b2).await, Ok(1));
    // a fails for good past a limit of 0: the task halts while b waits in the lane
    assert_eq!(env.fail_as(&a, 0, "bad", Failure::Permanent).await, Ok(1));
    assert_eq!(shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await.unwrap(), 2);
    let c = env.claim("ex", 3, 2, LOCK).await.shards;
    let b3 = c.iter().find(|x| x.shard_ref == b.shard_ref).expect("b again");
    assert!(b3.attempt > 2, "attempt {} was seen already", b3.attempt);
}

#[tokio::test]
async fn success_when_settles_the_task_cancels_the_rest_and_it_completes() {
    let mut env = ScriptEnv::start("fp_settle").await;
    let spec = TaskSpec { success_when: Some(Threshold::Percent(60.0)), ..TaskSpec::new("t", "noop", 10) };
    env.dispatch(&spec).await;
    assert_eq!(env.count("t", "success_when").await, 6);
    let c = env.claim("ex", 1, 10, LOCK).await.shards;
    assert_eq!(env.fail_as(&c[0], 0, "bad row", Failure::Permanent).await, Ok(1));
    for s in &c[1..6] {
        assert_eq!(env.complete(s, "").await, Ok(1));
    }
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
    // the sixth success: settled, the other three cancelled where they run
    assert_eq!(env.complete(&c[6], "7").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    assert_eq!((env.count("t", "done").await, env.count("t", "cancelled").await), (6, 3));
    assert_eq!(env.active().await, Vec::<String>::new());
    for s in &c[7..] {
        assert!(env.complete(s, "").await.is_err(), "a cancelled shard's outcome is refused");
    }
    assert_eq!(env.count("t", "done").await, 6, "a cancelled shard is never counted as done");
    let held: Vec<usize> = env.extend("ex", &[&c[7], &c[8]], LOCK).await;
    assert!(held.is_empty(), "the heartbeat reports them cancelled, not lost: {held:?}");
    // the aggregation runs once and the task completes, the failure before it settled aside
    let agg = env.claim("ex", 2, 10, LOCK).await.shards;
    assert_eq!(agg.len(), 1);
    assert!(agg[0].shard_ref.is_aggregate());
    assert_eq!(env.complete(&agg[0], "{}").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("completed"));
    assert_eq!(env.events("task_settled").await.len(), 1);
    let e = shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await.unwrap_err().to_string();
    assert!(e.contains("met its --success-when"), "{e}");
}

#[tokio::test]
async fn the_first_failure_keeps_a_message_line_of_a_traceback_or_a_stack() {
    let mut env = ScriptEnv::start("fp_first").await;
    env.dispatch(&TaskSpec::new("t", "noop", 1)).await;
    env.dispatch(&TaskSpec::new("u", "noop", 1)).await;
    let c = env.claim("ex", 1, 2, LOCK).await.shards;
    let node = "/app/w.js:3\n  throw new Error('boom');\n  ^\n\nError: boom\n    at Object.<anonymous> (/app/w.js:3:9)\n    at Module._compile (node:internal/modules/cjs/loader:1256:14)\n\nNode.js v18.17.0\n";
    let py = "Traceback (most recent call last):\n  File \"w.py\", line 3, in h\nValueError: bad date\n";
    for (s, why) in c.iter().zip([node, py]) {
        assert_eq!(env.fail_as(s, 0, why, Failure::Permanent).await, Ok(1));
    }
    let first =
        |id: &str| format!("0 {}", if c[0].shard_ref.task == id { "Error: boom" } else { "ValueError: bad date" });
    assert_eq!(env.field("t", "first_failure").await, Some(first("t")));
    assert_eq!(env.field("u", "first_failure").await, Some(first("u")));
}

/// k met by the completion that also makes every shard terminal: the task met its goal and
/// completes, whatever failed before.
#[tokio::test]
async fn k_met_by_the_last_shard_completes_despite_an_earlier_failure() {
    let mut env = ScriptEnv::start("fp_k_last").await;
    let spec = TaskSpec { success_when: Some(Threshold::Count(2)), ..TaskSpec::new("t", "noop", 3) };
    env.dispatch(&spec).await;
    let c = env.claim("ex", 1, 3, LOCK).await.shards;
    assert_eq!(c.len(), 3);
    assert_eq!(env.fail_as(&c[0], 0, "bad row", Failure::Permanent).await, Ok(1));
    assert_eq!(env.complete(&c[1], "").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("running"));
    // the second success: k = 2 met, and it is also the last shard
    assert_eq!(env.complete(&c[2], "").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("aggregating"));
    let agg = env.claim("ex", 2, 10, LOCK).await.shards;
    assert!(agg[0].shard_ref.is_aggregate());
    assert_eq!(env.complete(&agg[0], "{}").await, Ok(1));
    // nothing was left to cancel, but the goal was met: it completes
    assert_eq!(env.field("t", "state").await.as_deref(), Some("completed"), "2 of 3 succeeded, k = 2");
}

/// The same met in one batch: one shard done in a batch that completes every other shard.
#[tokio::test]
async fn k_met_in_a_batch_that_ends_every_shard() {
    let mut env = ScriptEnv::start("fp_k_batch").await;
    let spec = TaskSpec { success_when: Some(Threshold::Count(3)), ..TaskSpec::new("t", "noop", 4) };
    env.dispatch(&spec).await;
    let c = env.claim("ex", 1, 4, LOCK).await.shards;
    assert_eq!(env.fail_as(&c[0], 0, "bad row", Failure::Permanent).await, Ok(1));
    let items: Vec<_> = c[1..]
        .iter()
        .map(|s| shardctl_common::scripts::Finished {
            claim: s,
            outcome: shardctl_common::scripts::FinishedAs::Completed(""),
            ran_ms: None,
        })
        .collect();
    shardctl_common::scripts::finish(&mut env.con, &env.keys, support::NODE, &items).await.unwrap();
    let agg = env.claim("ex", 2, 10, LOCK).await.shards;
    assert_eq!(env.complete(&agg[0], "{}").await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("completed"), "3 of 4 succeeded, k = 3");
}

/// A settled task whose aggregation failed for good: `retry` runs its aggregation again (and
/// nothing else).
#[tokio::test]
async fn a_settled_task_whose_aggregation_failed_can_be_retried() {
    let mut env = ScriptEnv::start("fp_k_aggfail").await;
    let spec = TaskSpec { success_when: Some(Threshold::Count(1)), ..TaskSpec::new("t", "noop", 3) };
    env.dispatch(&spec).await;
    let c = env.claim("ex", 1, 1, LOCK).await.shards;
    assert_eq!(env.complete(&c[0], "").await, Ok(1));
    assert_eq!(env.field("t", "cancelled").await.as_deref(), Some("2"), "settled");
    let agg = env.claim("ex", 2, 10, LOCK).await.shards;
    assert!(agg[0].shard_ref.is_aggregate());
    assert_eq!(env.fail_as(&agg[0], 0, "upstream 503", Failure::Permanent).await, Ok(1));
    assert_eq!(env.field("t", "state").await.as_deref(), Some("failed"));
    let r = shardctl_common::retry::retry(&mut env.con, &env.keys, "t").await;
    assert!(matches!(r, Ok(1)), "the aggregation should run again: {r:?}");
}

/// The aggregation job of a settled task lost to the sweep (its holder froze): the heartbeat
/// reports it lost, not cancelled.
#[tokio::test]
async fn a_settled_tasks_aggregation_lost_to_the_sweep_is_lost_not_cancelled() {
    let mut env = ScriptEnv::start("fp_k_agglost").await;
    let spec = TaskSpec { success_when: Some(Threshold::Count(1)), ..TaskSpec::new("t", "noop", 3) };
    env.dispatch(&spec).await;
    let c = env.claim("ex", 1, 1, LOCK).await.shards;
    assert_eq!(env.complete(&c[0], "").await, Ok(1));
    let agg = env.claim("ex", 2, 10, LOCK).await.shards;
    assert!(agg[0].shard_ref.is_aggregate());
    env.drop_lease("ex").await;
    let r = env.sweep(60_000, 5).await.unwrap();
    assert_eq!(r.recovered, 1);
    let other = env.claim("ex2", 1, 10, LOCK).await.shards;
    assert!(other[0].shard_ref.is_aggregate());
    let lost = env.extend_checked("ex", &[&agg[0]], LOCK, true).await;
    assert_eq!(lost, vec![0], "its lock was taken over: lost, not a cancel");
}
