//! The executor runtime in process, against a real redis-server: claiming, running handlers
//! (Rust and child processes), retries, failures, graceful shutdown, lost locks, a Redis restart
//! and the recovery of a dead executor's shards (docs/design/lock-protocol.md). Each test has
//! its own server; timings are small, and only states and counts are asserted, never elapsed times.

#[path = "runtime_support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use shardctl_common::kinds::Served;
use shardctl_common::model::{TaskSpec, TaskState};
use shardctl_common::scripts::{self, ClaimRequest};
use shardctl_common::split::shard_range;
use shardctl_executor::builtin::fails_at;
use shardctl_executor::child::{ExecAggregator, ExecCommand, ExecHandler};
use shardctl_executor::{BoxFuture, ExecutorConfig, Handler, Registry, ShardContext, ShardError, StatsSnapshot};
use support::{config, eventually_async, Doomed, RuntimeEnv, PATIENCE};
// the coordinator's files name their siblings `crate::<module>`: this root must have them all

fn spec(id: &str, kind: &str, shards: u64, payload: Value) -> TaskSpec {
    TaskSpec { payload: payload.to_string(), ..TaskSpec::new(id, kind, shards) }
}

fn sum(stats: &[StatsSnapshot], field: fn(&StatsSnapshot) -> u64) -> u64 {
    stats.iter().map(field).sum()
}

/// Once a task has ended, nothing of it may be left running, waiting, held or retried (an
/// executor's lease may outlive it, holding nothing).
async fn assert_queue_is_clean(env: &RuntimeEnv) {
    assert_eq!(env.active().await, 0, "active shards left");
    assert!(env.wait_list().await.is_empty(), "refs left waiting: {:?}", env.wait_list().await);
    env.assert_nothing_held().await;
    // per-shard state is gone; only the record of each failure stays beside its reason (its
    // time, attempt and node: docs/design/dashboard.md)
    for key in env.keys_like(":shards").await {
        let fields: Vec<String> = env.cmd(redis::cmd("HKEYS").arg(&key)).await;
        assert!(fields.iter().all(|f| f.ends_with(":failure")), "shard state left in {key}: {fields:?}");
    }
    let delayed: u64 = env.cmd(redis::cmd("ZCARD").arg(env.keys.delayed())).await;
    assert_eq!(delayed, 0, "delayed retries left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end_primes() {
    let env = RuntimeEnv::start().await;
    let a = env.executor(config("a"), Registry::with_builtins()).await;
    let b = env.executor(config("b"), Registry::with_builtins()).await;
    env.dispatch(&TaskSpec { items: 100_000, ..TaskSpec::new("primes", "primes", 200) }).await;

    let t = env.wait("primes").await;
    let stats = [a.stop().await, b.stop().await];
    assert_eq!(t.state, TaskState::Completed, "{t:?}");
    assert_eq!(t.result, Some(json!({ "primes": 9592 })));
    assert_eq!((t.done, t.failed), (200, 0));
    assert_eq!(sum(&stats, |s| s.completed), 200, "{stats:?}");
    assert_eq!(sum(&stats, |s| s.aggregated), 1, "{stats:?}");
    assert_eq!(sum(&stats, |s| s.failed + s.refused + s.duplicates + s.released), 0, "{stats:?}");
    let results: u64 = env.cmd(redis::cmd("HLEN").arg(env.keys.results("primes"))).await;
    assert_eq!(results, 200);
    assert_queue_is_clean(&env).await;
}

// One slot and nothing claimed ahead: each shard's completion is due when the next claim is, and
// rides on it (one script call for both); counting stays exact and the aggregation runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_ride_on_the_next_claim() {
    let env = RuntimeEnv::start().await;
    let cfg = ExecutorConfig { concurrency: 1, prefetch: 0, ..config("a") };
    let a = env.executor(cfg, Registry::with_builtins()).await;
    env.dispatch(&TaskSpec { items: 100_000, ..TaskSpec::new("primes", "primes", 60) }).await;
    let t = env.wait("primes").await;
    let stats = a.stop().await;
    assert_eq!(t.result, Some(json!({ "primes": 9592 })), "{t:?}");
    assert_eq!((t.done, t.failed, stats.completed, stats.aggregated), (60, 0, 60, 1), "{stats:?}");
    assert_eq!(stats.failed + stats.refused + stats.duplicates + stats.released, 0, "{stats:?}");
    // all 60 on a quiet machine; the reporter records one alone when the claim loop is not
    // scheduled within its 5 ms bound
    assert!(stats.with_claim >= 20, "most completions must ride on a claim: {stats:?}");
    assert_queue_is_clean(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_retry_then_fail_for_good() {
    let env = RuntimeEnv::start().await;
    let ex = env.executor(config("a"), Registry::with_builtins()).await;
    let n = 20;
    let s =
        TaskSpec { attempts: 2, backoff: "fixed:10ms".parse().unwrap(), ..spec("f", "fail", n, json!({"rate": 1.0})) };
    env.dispatch(&s).await;

    let t = env.wait("f").await;
    let stats = ex.stop().await;
    assert_eq!(t.state, TaskState::Failed, "{t:?}");
    assert_eq!((t.done, t.failed), (0, n));
    // the aggregation still ran, and recorded its result
    assert_eq!(t.result, Some(json!({ "completed": 0, "failed": n })));
    assert_eq!(t.aggregation_error, None);
    let failed = env.failed_shards("f").await;
    assert_eq!(failed.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
    for (i, reason) in &failed {
        assert!(reason.contains("injected failure") && reason.contains("attempt 2"), "shard {i}: {reason}");
    }
    // every shard twice, plus the aggregation job once
    assert_eq!((stats.claimed, stats.retried, stats.failed, stats.aggregated), (2 * n + 1, n, n, 1), "{stats:?}");
    assert_queue_is_clean(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partial_failures_are_retried_and_counted_once() {
    let env = RuntimeEnv::start().await;
    let a = env.executor(config("a"), Registry::with_builtins()).await;
    let b = env.executor(config("b"), Registry::with_builtins()).await;
    let (n, attempts, rate) = (100u64, 5u32, 0.3);
    let s =
        TaskSpec { attempts, backoff: "fixed:10ms".parse().unwrap(), ..spec("p", "fail", n, json!({"rate": rate})) };
    env.dispatch(&s).await;

    let t = env.wait("p").await;
    let stats = [a.stop().await, b.stop().await];
    // `fail` decides by task, shard and attempt: the outcome is known in advance
    let fails = |i: u64| (1..=attempts).take_while(|&a| fails_at("p", i, a, rate)).count() as u64;
    let for_good: Vec<u64> = (0..n).filter(|&i| fails(i) == u64::from(attempts)).collect();
    let retries: u64 = (0..n).map(|i| fails(i).min(u64::from(attempts) - 1)).sum();
    assert!(t.state.is_finished());
    assert_eq!(t.done + t.failed, n, "{t:?}");
    assert_eq!(t.failed, for_good.len() as u64, "{t:?}");
    assert_eq!(t.state == TaskState::Completed, for_good.is_empty(), "{t:?}");
    assert_eq!(t.result, Some(json!({ "completed": t.done, "failed": t.failed })));
    assert_eq!(env.failed_shards("p").await.into_iter().map(|(i, _)| i).collect::<Vec<_>>(), for_good);
    assert_eq!(sum(&stats, |s| s.completed), t.done, "{stats:?}");
    assert_eq!(sum(&stats, |s| s.failed), t.failed, "{stats:?}");
    assert_eq!(sum(&stats, |s| s.retried), retries, "{stats:?}");
    assert_queue_is_clean(&env).await;
}

// ---------------------------------------------------------------------------------------------
// Handler errors: each becomes a shard failure with a clear reason, and the task still ends.

/// Runs a task of three shards of `kind`, one attempt each, on one executor until it ends, and
/// returns the failed shards with their reasons. Every shard must fail, the task must still end
/// with its aggregation, and the executor must go on to run another task.
async fn failing_task(cfg: ExecutorConfig, registry: Registry, kind: &str, payload: Value) -> Vec<(u64, String)> {
    let env = RuntimeEnv::start().await;
    let ex = env.executor(cfg, registry).await;
    let shards = 3;
    env.dispatch(&TaskSpec { attempts: 1, ..spec("bad", kind, shards, payload) }).await;
    let t = env.wait("bad").await;
    assert_eq!(t.state, TaskState::Failed, "{t:?}");
    assert_eq!((t.done, t.failed), (0, shards), "{t:?}");
    assert_eq!(t.result, Some(json!({ "completed": 0, "failed": shards })));
    // nothing lost, and the executor still works
    env.dispatch(&spec("after", "noop", 2, Value::Null)).await;
    assert_eq!(env.wait("after").await.state, TaskState::Completed);
    let stats = ex.stop().await;
    assert_eq!((stats.failed, stats.completed), (shards, 2), "{stats:?}");
    let failed = env.failed_shards("bad").await;
    assert_eq!(failed.len() as u64, shards, "{failed:?}");
    assert_queue_is_clean(&env).await;
    failed
}

fn assert_reasons(failed: &[(u64, String)], want: &str) {
    for (i, reason) in failed {
        assert!(reason.contains(want), "shard {i}: reason {reason:?} does not contain {want:?}");
    }
}

fn exec(line: &str, limit: usize) -> Registry {
    let mut r = Registry::with_builtins();
    r.fallback(Served::Every, ExecHandler(Arc::new(ExecCommand::parse(line, limit).unwrap())));
    r
}

struct Panics;

impl Handler for Panics {
    fn run(&self, _ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async { panic!("boom") })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_fails_its_shard() {
    let mut r = Registry::with_builtins();
    r.handler("panics", Panics);
    let failed = failing_task(config("a"), r, "panics", Value::Null).await;
    assert!(failed.iter().all(|(_, reason)| reason == "handler panicked: boom"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_command_fails_with_its_status_and_stderr() {
    let failed = failing_task(config("a"), exec("sh -c 'echo oops >&2; exit 7'", 1000), "ext", Value::Null).await;
    assert!(failed.iter().all(|(_, reason)| reason == "handler exited with status 7: oops"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_utf8_output_fails() {
    let failed = failing_task(config("a"), exec(r#"sh -c 'printf "\377\376"'"#, 1000), "ext", Value::Null).await;
    assert_reasons(&failed, "not valid UTF-8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_over_the_limit_fails() {
    let line = r#"sh -c 'head -c 1000 /dev/zero | tr "\0" a'"#;
    let failed = failing_task(config("a"), exec(line, 100), "ext", Value::Null).await;
    assert_reasons(&failed, "exceeds the limit of 100 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_command_fails() {
    let failed = failing_task(config("a"), exec("/nonexistent/cmd --flag", 1000), "ext", Value::Null).await;
    assert_reasons(&failed, "cannot start handler command '/nonexistent/cmd'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kind_the_executor_does_not_serve_is_left_alone() {
    let env = RuntimeEnv::start().await;
    let ex = env.executor(config("node-7"), Registry::with_builtins()).await;
    // dispatched first: a claim that took shards in order would meet it before the noop task
    env.dispatch(&spec("mystery", "mystery", 3, Value::Null)).await;
    env.dispatch(&spec("after", "noop", 2, Value::Null)).await;
    assert_eq!(env.wait("after").await.state, TaskState::Completed);
    let stats = ex.stop().await;
    assert_eq!((stats.failed, stats.completed), (0, 2), "{stats:?}");
    // never claimed, never failed: all of it still ahead in its kind's lane
    let t = env.task("mystery").await;
    assert_eq!((t.state, t.cursor, t.done, t.failed), (TaskState::Running, 0, 0, 0), "{t:?}");
    let runnable: Vec<String> = env.cmd(redis::cmd("ZRANGE").arg(env.keys.lane_tasks("mystery")).arg(0).arg(-1)).await;
    assert_eq!(runnable, ["mystery"]);
    env.assert_nothing_held().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_payload_fails() {
    let failed = failing_task(config("a"), Registry::with_builtins(), "sleep", json!({"seconds": 1})).await;
    assert_reasons(&failed, "malformed payload for kind sleep");
}

struct Big;

impl Handler for Big {
    fn run(&self, _ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async { Ok(json!("x".repeat(1000))) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_result_fails() {
    let mut r = Registry::with_builtins();
    r.handler("big", Big);
    let cfg = ExecutorConfig { max_result_bytes: 64, ..config("a") };
    let failed = failing_task(cfg, r, "big", Value::Null).await;
    assert!(failed.iter().all(|(_, reason)| reason == "result is 1002 bytes; the limit is 64"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_handler_and_aggregator_speak_json_lines() {
    let env = RuntimeEnv::start().await;
    // odd shards fail, so that the aggregator sees both kinds of line
    let script = concat!(
        r#"p=$(cat); "#,
        r#"if [ $((SHARDCTL_SHARD_INDEX % 2)) = 1 ]; then echo "odd $SHARDCTL_SHARD_INDEX" >&2; exit 3; fi; "#,
        r#"echo "{\"i\":$SHARDCTL_SHARD_INDEX,\"a\":$SHARDCTL_ATTEMPT,\"n\":$SHARDCTL_SHARD_TOTAL,"#,
        r#"\"s\":$SHARDCTL_RANGE_START,\"e\":$SHARDCTL_RANGE_END,\"p\":$p}""#,
    );
    let mut r = exec(&format!("sh -c '{script}'"), 10_000);
    r.fallback_aggregator(ExecAggregator(Arc::new(ExecCommand::parse("cat", 1 << 20).unwrap())));
    let ex = env.executor(config("a"), r).await;
    let (n, items) = (6u64, 20u64);
    env.dispatch(&TaskSpec { items, attempts: 1, ..spec("x", "ext", n, json!({"k": [1, 2]})) }).await;

    let t = env.wait("x").await;
    let stats = ex.stop().await;
    assert_eq!((t.state, t.done, t.failed), (TaskState::Failed, n / 2, n / 2), "{t:?}");
    assert_eq!(t.aggregation_error, None);
    let Some(Value::String(out)) = &t.result else { panic!("the aggregator's output is not kept as text: {t:?}") };
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let want: Vec<Value> = (0..n)
        .map(|i| {
            if i % 2 == 1 {
                json!({ "shard": i, "error": format!("handler exited with status 3: odd {i}") })
            } else {
                let r = shard_range(i, n, items);
                json!({ "shard": i, "result": { "i": i, "a": 1, "s": r.start, "e": r.end, "n": n, "p": {"k": [1, 2]} } })
            }
        })
        .collect();
    assert_eq!(lines, want);
    assert_eq!((stats.completed, stats.failed, stats.aggregated), (n / 2, n / 2, 1), "{stats:?}");
}

// ---------------------------------------------------------------------------------------------
// Shutdown, lost locks, outages and crashes.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_releases_at_once() {
    let env = RuntimeEnv::start().await;
    // a long lock: only the release can make these shards claimable again soon
    let cfg = ExecutorConfig {
        lock_duration: Duration::from_secs(30),
        lock_renew: Duration::from_secs(10),
        grace: Duration::from_millis(200),
        ..config("a")
    };
    let a = env.executor(cfg.clone(), Registry::with_builtins()).await;
    env.dispatch(&spec("s", "sleep", 8, json!({"ms": 60_000}))).await;
    eventually_async("A to hold 4 shards", PATIENCE, || async { env.active().await == 4 }).await;

    let stats = a.stop().await;
    assert_eq!((stats.claimed, stats.released, stats.completed, stats.failed), (4, 4, 0, 0), "{stats:?}");
    assert_eq!(env.active().await, 0);
    let mut waiting = env.wait_list().await;
    waiting.sort();
    assert_eq!(waiting, ["s:1:0", "s:1:1", "s:1:2", "s:1:3"]);
    env.assert_nothing_held().await;
    let t = env.task("s").await;
    assert_eq!((t.state, t.done, t.failed, t.cursor), (TaskState::Running, 0, 0, 4), "{t:?}");

    // the released four and the untaken four are all claimable at once
    let b = env.executor(ExecutorConfig { concurrency: 8, ..cfg }, Registry::with_builtins()).await;
    eventually_async("B to hold all 8 shards", PATIENCE, || async { env.active().await == 8 }).await;
    let stats = b.stop().await;
    assert_eq!((stats.claimed, stats.released), (8, 8), "{stats:?}");
    assert_eq!(env.task("s").await.done, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_within_grace() {
    let env = RuntimeEnv::start().await;
    let a =
        env.executor(ExecutorConfig { grace: Duration::from_secs(10), ..config("a") }, Registry::with_builtins()).await;
    env.dispatch(&spec("d", "sleep", 8, json!({"ms": 300}))).await;
    eventually_async("4 shards to run", PATIENCE, || async { env.active().await == 4 }).await;

    let stats = a.stop().await;
    assert!(stats.claimed >= 4, "{stats:?}");
    assert_eq!((stats.completed, stats.released, stats.failed), (stats.claimed, 0, 0), "{stats:?}");
    let t = env.task("d").await;
    assert_eq!((t.state, t.done, t.failed, t.cursor), (TaskState::Running, stats.claimed, 0, stats.claimed), "{t:?}");
    assert_eq!(env.active().await, 0);
    assert!(env.wait_list().await.is_empty());
}

/// Waits for its cancellation; tells the test which token it got and when it stopped. (std
/// Mutex: held only to store or copy the token, never across an await.)
#[derive(Clone, Default)]
struct WaitForCancel {
    token: Arc<Mutex<Option<tokio_util::sync::CancellationToken>>>,
    stopped: Arc<AtomicBool>,
}

/// Sets its flag when dropped: the handler's future stopped, by returning or by being dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Handler for WaitForCancel {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        *self.token.lock().unwrap() = Some(ctx.cancel.clone());
        let stopped = SetOnDrop(self.stopped.clone());
        Box::pin(async move {
            let _stopped = stopped;
            ctx.cancel.cancelled().await;
            Err(ShardError::new("cancelled"))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_lock_cancels_handler() {
    let env = RuntimeEnv::start().await;
    let h = WaitForCancel::default();
    let mut r = Registry::with_builtins();
    r.handler("hold", h.clone());
    let cfg = config("a");
    let instance = cfg.instance.clone();
    let a = env.executor(cfg, r).await;
    env.dispatch(&spec("l", "hold", 1, Value::Null)).await;
    eventually_async("the handler to start", PATIENCE, || async { h.token.lock().unwrap().is_some() }).await;
    assert!(!h.stopped.load(Ordering::SeqCst));

    // another holder takes the shard over while A's lease is gone
    env.take_over("l:1:0", &instance, "other:1").await;
    eventually_async("the heartbeat to find the lock lost", PATIENCE, || async { a.now().locks_lost == 1 }).await;
    let token = h.token.lock().unwrap().clone().unwrap();
    assert!(token.is_cancelled(), "the handler's token was not cancelled");
    eventually_async("the handler to stop", PATIENCE, || async { h.stopped.load(Ordering::SeqCst) }).await;

    let stats = a.stop().await;
    assert_eq!((stats.locks_lost, stats.completed, stats.failed, stats.released), (1, 0, 0, 0), "{stats:?}");
    // the stale holder recorded nothing and left the new holder's hold alone
    let t = env.task("l").await;
    assert_eq!((t.done, t.failed), (0, 0), "{t:?}");
    assert_eq!(env.holders().await, HashMap::from([("l:1:0".to_owned(), "other:1".to_owned())]));
    assert!(env.failed_shards("l").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_lock_kills_the_child_process() {
    let env = RuntimeEnv::start().await;
    let dir = std::env::temp_dir().join(format!("shardctl-runtime-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("pid");
    // exec: the handler's child is the sleeping process itself
    let line = format!("sh -c 'echo $$ > {}; exec sleep 60'", pid_file.display());
    let cfg = config("a");
    let instance = cfg.instance.clone();
    let a = env.executor(cfg, exec(&line, 1000)).await;
    env.dispatch(&spec("k", "ext", 1, Value::Null)).await;
    let pid = || std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<u32>().ok());
    eventually_async("the child to start", PATIENCE, || async { pid().is_some() }).await;
    let pid = pid().unwrap();
    let alive = move || {
        // a zombie (state Z) has been killed already, only not yet reaped
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    assert!(alive(), "the child {pid} is not running");

    env.take_over("k:1:0", &instance, "other:1").await;
    eventually_async("the heartbeat to find the lock lost", PATIENCE, || async { a.now().locks_lost == 1 }).await;
    eventually_async("the child process to be killed", PATIENCE, || async { !alive() }).await;
    let stats = a.stop().await;
    assert_eq!((stats.locks_lost, stats.completed, stats.failed), (1, 0, 0), "{stats:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// Regression: this once lost a claim's shards to a restart about 1 run in 6 (see
// shards_of_a_claim_whose_reply_was_lost_are_recovered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_under_running_executor() {
    let mut env = RuntimeEnv::start_persistent().await;
    let sweeper = env.sweeper(Duration::from_millis(200), 5);
    let a = env.executor(ExecutorConfig { concurrency: 8, ..config("a") }, Registry::with_builtins()).await;
    let n = 300;
    env.dispatch(&spec("r", "sleep", n, json!({"ms": 20}))).await;
    eventually_async("some shards to be done", PATIENCE, || async { env.task("r").await.done >= 40 }).await;

    // same port, data kept through the append-only file; restart() blocks, so off the runtime
    tokio::task::block_in_place(|| env.redis.restart());
    let t = env.wait("r").await;
    let stats = a.stop().await;
    sweeper.stop().await;
    assert_eq!((t.state, t.done, t.failed), (TaskState::Completed, n, 0), "{t:?} {stats:?}");
    assert_eq!(t.result, Some(json!({ "completed": n, "failed": 0 })));
    // at least once: a shard whose lock expired in the outage may have run twice, counted once
    assert!(stats.completed <= n && stats.completed + stats.refused + stats.duplicates >= n, "{stats:?}");
    assert_queue_is_clean(&env).await;
}

/// Never returns on node `a` (it plays a hung executor); returns at once elsewhere, noting the
/// attempt it ran as. (std Mutex: held for one insert, never across an await.)
#[derive(Clone, Default)]
struct Flaky {
    runs: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Handler for Flaky {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        let runs = self.runs.clone();
        Box::pin(async move {
            if &*ctx.node_id == "a" {
                std::future::pending::<()>().await;
            }
            runs.lock().unwrap().insert(ctx.index, ctx.attempt);
            Ok(Value::Null)
        })
    }
}

fn flaky_registry(h: &Flaky) -> Registry {
    let mut r = Registry::with_builtins();
    r.handler("flaky", h.clone());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_shard_recovered_from_a_dead_executor() {
    let env = RuntimeEnv::start().await;
    let h = Flaky::default();
    let cfg_a = ExecutorConfig {
        lock_duration: Duration::from_millis(500),
        lock_renew: Duration::from_millis(150),
        ..config("a")
    };
    // A lives on a runtime of its own: shutting that down drops every task of A at once (claim
    // loop, heartbeat, reporter, handlers, connections), as a crash would
    let rt_a = Doomed::new();
    let (endpoint, keys, reg_a) = (env.endpoint.clone(), env.keys.clone(), flaky_registry(&h));
    rt_a.spawn(async move {
        let ex = shardctl_executor::Executor::connect(endpoint, keys, cfg_a, reg_a).await.expect("connect");
        ex.run(tokio_util::sync::CancellationToken::new()).await
    });
    env.dispatch(&spec("st", "flaky", 4, Value::Null)).await;
    eventually_async("A to hold all 4 shards", PATIENCE, || async { env.active().await == 4 }).await;
    rt_a.crash();

    let sweeper = env.sweeper(Duration::from_millis(200), 5);
    let b = env.executor(config("b"), flaky_registry(&h)).await;
    let t = env.wait("st").await;
    let stats = b.stop().await;
    sweeper.stop().await;
    assert_eq!((t.state, t.done, t.failed), (TaskState::Completed, 4, 0), "{t:?}");
    assert_eq!((stats.completed, stats.aggregated), (4, 1), "{stats:?}");
    // each ran once on B, as its second claim
    let runs = h.runs.lock().unwrap().clone();
    assert_eq!(runs, (0..4).map(|i| (i, 2)).collect::<HashMap<_, _>>());
    assert_queue_is_clean(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_aggregator_fails_the_task_with_its_reason() {
    let env = RuntimeEnv::start().await;
    // a kind the fallback handler runs: --aggregate-exec aggregates those, not the built-in ones
    let mut r = exec("true", 100);
    r.fallback_aggregator(ExecAggregator(Arc::new(ExecCommand::parse("sh -c 'echo no >&2; exit 1'", 100).unwrap())));
    let ex = env.executor(config("a"), r).await;
    env.dispatch(&TaskSpec {
        attempts: 2,
        backoff: "fixed:10ms".parse().unwrap(),
        ..spec("g", "external", 3, Value::Null)
    })
    .await;

    let t = env.wait("g").await;
    let stats = ex.stop().await;
    assert_eq!((t.state, t.done, t.failed), (TaskState::Failed, 3, 0), "{t:?}");
    assert_eq!((t.result, t.aggregation_error.as_deref()), (None, Some("handler exited with status 1: no")));
    // the aggregation job was retried once, then failed for good
    assert_eq!((stats.completed, stats.retried, stats.failed, stats.aggregated), (3, 1, 1, 0), "{stats:?}");
    assert_queue_is_clean(&env).await;
}

// Regression: the claim loop used to drop a claim call in flight when shutdown came; the script
// still ran in Redis, and its shards stayed locked under a stopped executor until the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_during_a_claim_call_leaves_nothing_claimed() {
    let env = RuntimeEnv::start().await;
    // a claim call that keeps Redis busy for about a second: before reaching the task's cursor,
    // the claim script pops and drops, one by one, many refs of a task that does not exist
    let fill = "for i = 1, tonumber(ARGV[1]) do redis.call('RPUSH', KEYS[1], 'gone:' .. i) end";
    let () = env.cmd(redis::cmd("EVAL").arg(fill).arg(1).arg(env.keys.lane_wait("sleep")).arg(600_000)).await;
    env.dispatch(&spec("c", "sleep", 4, json!({"ms": 60_000}))).await;
    let cfg = ExecutorConfig {
        lock_duration: Duration::from_secs(30),
        lock_renew: Duration::from_secs(10),
        grace: Duration::from_millis(200),
        ..config("a")
    };
    let a = env.executor(cfg, Registry::with_builtins()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // the shutdown comes while the first claim call is still running in Redis
    let stats = a.stop().await;
    assert_eq!(stats.released, stats.claimed, "{stats:?}");
    // this executor has stopped: nothing may be left claimed under its name
    let held = env.holders().await;
    assert!(held.is_empty(), "shards claimed by a stopped executor: {held:?}");
    env.assert_nothing_held().await;
}

// Regression: a heartbeat that ran between a shard's completion and the reporter forgetting it
// found the lock gone and counted a lost lock (and cancelled a finished handler): 91 to 187 of
// 5,000 here before the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lock_is_counted_lost_when_none_was() {
    let env = RuntimeEnv::start().await;
    let cfg = ExecutorConfig {
        concurrency: 16,
        lock_duration: Duration::from_secs(10),
        lock_renew: Duration::from_millis(5),
        ..config("a")
    };
    let a = env.executor(cfg, Registry::with_builtins()).await;
    let n = 5000;
    env.dispatch(&spec("n", "noop", n, Value::Null)).await;
    let t = env.wait("n").await;
    let stats = a.stop().await;
    assert_eq!((t.state, t.done), (TaskState::Completed, n));
    // every lock lived 10 s and was released by its own holder: none was lost
    assert_eq!((stats.completed, stats.refused), (n, 0), "{stats:?}");
    assert_eq!(stats.locks_lost, 0, "locks counted lost although none was: {stats:?}");
}

// ---------------------------------------------------------------------------------------------
// Regressions of the lease layout.

// Regression: shards of a claim whose reply was lost stayed held under the executor's live lease;
// the heartbeat now reconciles `active` against what the executor knows and gives them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_of_a_claim_whose_reply_was_lost_are_recovered() {
    let env = RuntimeEnv::start().await;
    env.dispatch(&spec("o", "noop", 6, Value::Null)).await;
    let cfg = config("a");
    let instance = cfg.instance.clone();
    // a claim call of this executor that ran in Redis but whose reply never reached it (a seq
    // the executor itself never uses)
    let req = ClaimRequest {
        count: 2,
        lock_ms: cfg.lock_duration.as_millis() as u64,
        instance: &instance,
        seq: 1 << 40,
        node: &cfg.node_id,
        ahead: 0,
        speeds: None,
        kinds: &Served::Every,
    };
    let mut con = env.con.clone();
    let orphans = scripts::claim(&mut con, &env.keys, &req).await.expect("claim").shards;
    assert_eq!(orphans.len(), 2);

    let sweeper = env.sweeper(Duration::from_millis(200), 5);
    let a = env.executor(cfg, Registry::with_builtins()).await;
    // until it ended (not merely left `running`: the aggregation runs after the shards); the
    // lease-less shards are marked, confirmed and run within a few lock durations
    eventually_async("the task to end", PATIENCE, || async { env.task("o").await.state.is_finished() }).await;
    let t = env.task("o").await;
    let held = env.holders().await;
    let stats = a.stop().await;
    sweeper.stop().await;
    assert_eq!(
        (t.state, t.done),
        (TaskState::Completed, 6),
        "the orphaned shards were never recovered: held {held:?}, executor {stats:?}"
    );
}

// Regression: `Executor::run` once left its heartbeat running when its future was dropped, so
// the locks of an executor that was gone never expired and its shards were never recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aborting_the_run_future_lets_its_locks_expire() {
    let env = RuntimeEnv::start().await;
    let h = Flaky::default();
    // a renew far below the lock: a late heartbeat must not let the lease expire and hide the bug
    let cfg = ExecutorConfig { lock_renew: Duration::from_millis(100), ..config("a") };
    let instance = cfg.instance.clone();
    let a = env.executor(cfg, flaky_registry(&h)).await;
    env.dispatch(&spec("ab", "flaky", 4, Value::Null)).await;
    eventually_async("A to hold all 4 shards", PATIENCE, || async { env.active().await == 4 }).await;
    assert!(env.lease_ttl(&instance).await.is_some(), "a running executor has a lease");
    a.abort().await;

    // four lock durations later, with nothing left of A, its lease must have expired
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ttl = env.lease_ttl(&instance).await;
    assert_eq!(ttl, None, "an aborted executor still keeps its lease alive: {ttl:?} ms left");
    // so whatever it still holds (the abort may have released some) is stalled: the sweep gives
    // it back
    let held = env.holders().await;
    assert!(held.values().all(|t| t.starts_with(&format!("{instance}:"))), "{held:?}");
    let sweeper = env.sweeper(Duration::from_millis(100), 5);
    eventually_async("the sweep to recover A's shards", PATIENCE, || async { env.active().await == 0 }).await;
    sweeper.stop().await;
    let mut waiting = env.wait_list().await;
    waiting.sort();
    assert_eq!(waiting, ["ab:1:0", "ab:1:1", "ab:1:2", "ab:1:3"]);
}

/// Counts handlers running at once and the most ever seen; shards below index `quick` take 5 ms,
/// the others `ms`.
struct Gauge {
    now: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    quick: u64,
    ms: u64,
}

impl Handler for Gauge {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        let (now, most) = (self.now.clone(), self.most.clone());
        let ms = if ctx.index < self.quick { 5 } else { self.ms };
        Box::pin(async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Ok(Value::Null)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_are_claimed_ahead_only_when_short_and_given_back_at_shutdown() {
    let env = RuntimeEnv::start().await;
    let now = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let registry = |quick, ms| {
        let mut r = Registry::with_builtins();
        r.handler("gauge", Gauge { now: now.clone(), most: most.clone(), quick, ms });
        r
    };
    let cfg = ExecutorConfig { concurrency: 2, prefetch: 3, grace: Duration::from_millis(100), ..config("a") };

    // long shards from the start: nothing is claimed ahead of a free slot
    let a = env.executor(cfg.clone(), registry(0, 60_000)).await;
    env.dispatch(&spec("long", "gauge", 20, Value::Null)).await;
    eventually_async("two shards held", PATIENCE, || async { env.active().await == 2 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(env.active().await, 2, "a long shard is never claimed ahead");
    let stats = a.stop().await;
    assert_eq!((stats.claimed, stats.released), (2, 2), "{stats:?}");
    let mut con = env.con.clone();
    shardctl_common::control::cancel(&mut con, &env.keys, "long").await.expect("cancel");

    // 20 quick shards teach the executor their run time; it claims the slow ones after them
    // ahead, up to the bound of 3: five held, never more than two running (the two long ones
    // were dropped mid-sleep: the gauge starts again from zero)
    most.store(0, Ordering::SeqCst);
    now.store(0, Ordering::SeqCst);
    let a = env.executor(cfg.clone(), registry(20, 60_000)).await;
    env.dispatch(&spec("p", "gauge", 40, Value::Null)).await;
    eventually_async("five shards held", PATIENCE, || async { env.active().await == 5 }).await;
    // the two running are slow: once they have gone quiet for 100 ms, the three waiting are
    // given back, unstarted, to be claimed by whoever is free
    eventually_async("the three waiting to be given back", PATIENCE, || async { env.wait_list().await.len() == 3 })
        .await;
    assert_eq!(env.active().await, 2);
    assert_eq!(most.load(Ordering::SeqCst), 2, "only `concurrency` handlers run");
    // their claim was undone: the next claim hands out attempt 1 again
    let again = env.wait_list().await;
    let mut con = env.con.clone();
    let attempts: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(env.keys.shards("p"))
        .arg(again.iter().map(|r| format!("{}:attempt", r.rsplit(':').next().unwrap())).collect::<Vec<_>>())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(attempts.iter().all(Option::is_none), "{attempts:?}");
    // shutdown: the two running are given back after the grace
    let stats = a.stop().await;
    assert_eq!((stats.claimed, stats.released, stats.completed), (25, 5, 20), "{stats:?}");
    assert_eq!(env.active().await, 0);
    assert_eq!(env.wait_list().await.len(), 5, "all five claimable at once");
    let t = env.task("p").await;
    assert_eq!((t.done, t.failed), (20, 0), "{t:?}");

    // run to the end with quick shards: each counted once, still two at a time (the running two
    // were dropped mid-sleep by the shutdown: the gauge starts again from zero)
    most.store(0, Ordering::SeqCst);
    now.store(0, Ordering::SeqCst);
    let b = env.executor(ExecutorConfig { grace: Duration::from_secs(5), ..cfg }, registry(40, 5)).await;
    let t = env.wait("p").await;
    assert_eq!((t.state, t.done, t.failed), (TaskState::Completed, 40, 0), "{t:?}");
    assert!(most.load(Ordering::SeqCst) <= 2, "{} ran at once", most.load(Ordering::SeqCst));
    b.stop().await;
    assert_queue_is_clean(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_out_handler_is_stopped_with_everything_it_started() {
    let env = RuntimeEnv::start().await;
    let dir = std::env::temp_dir().join(format!("shardctl-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pids = dir.join("pids");
    // the handler's shell starts a grandchild and waits for it
    let line = format!("sh -c 'sleep 30 & echo $! >> {}; wait'", pids.display());
    let a = env.executor(config("a"), exec(&line, 1000)).await;
    let mut s = spec("g", "ext", 2, Value::Null);
    s.attempts = 1;
    s.shard_timeout = Some(Duration::from_millis(300));
    env.dispatch(&s).await;
    let t = env.wait("g").await;
    assert_eq!((t.state, t.failed), (TaskState::Failed, 2), "{t:?}");
    let started = std::fs::read_to_string(&pids).unwrap();
    let started: Vec<&str> = started.split_whitespace().collect();
    assert_eq!(started.len(), 2, "{started:?}");
    let alive = |pid: &str| std::process::Command::new("kill").args(["-0", pid]).status().unwrap().success();
    eventually_async("the handlers' grandchildren to be gone", PATIENCE, || async {
        started.iter().all(|p| !alive(p))
    })
    .await;
    a.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records the task of every shard it starts, then sleeps 2 ms.
struct Starts(Arc<Mutex<Vec<String>>>);

impl Handler for Starts {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        self.0.lock().unwrap().push(ctx.task_id.clone());
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(Value::Null)
        })
    }
}

// Claim-ahead and priorities: an executor busy with short low-priority shards holds ahead only
// what it would start within 20 ms, so a higher-priority task dispatched meanwhile starts after at
// most about that many more low shards (2 ms shards at concurrency 1: ~10), not after the
// `--prefetch` bound of 1024 it could have claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_claimed_ahead_delay_a_higher_priority_task_by_little() {
    let env = RuntimeEnv::start().await;
    let started = Arc::new(Mutex::new(Vec::new()));
    let mut r = Registry::with_builtins();
    r.handler("rec", Starts(started.clone()));
    let cfg = ExecutorConfig { concurrency: 1, grace: Duration::from_millis(100), ..config("a") };
    assert_eq!(cfg.prefetch, 1024, "the default bound");
    let a = env.executor(cfg, r).await;
    env.dispatch(&spec("low", "rec", 5000, Value::Null)).await;
    // the executor has measured its shards' run time and claims ahead
    eventually_async("200 low shards to start", PATIENCE, || async { started.lock().unwrap().len() >= 200 }).await;
    let at = started.lock().unwrap().len();
    let mut high = spec("high", "rec", 3, Value::Null);
    high.priority = 10;
    env.dispatch(&high).await;
    eventually_async("the high task to start", PATIENCE, || async {
        started.lock().unwrap()[at..].iter().any(|t| t == "high")
    })
    .await;
    let seen = started.lock().unwrap().clone();
    let before = seen[at..].iter().take_while(|t| *t == "low").count();
    assert!(before <= 25, "{before} low shards started after the high task was dispatched, before it");
    let t = env.wait("high").await;
    assert_eq!(t.done, 3);
    let mut con = env.con.clone();
    shardctl_common::control::cancel(&mut con, &env.keys, "low").await.expect("cancel");
    a.stop().await;
}

/// The refs held whose task is `task`, counted by the instance of their holder.
async fn held_by_instance(env: &RuntimeEnv, task: &str) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for (r, t) in env.holders().await {
        if r.starts_with(&format!("{task}:")) {
            *m.entry(t.rsplit_once(':').unwrap().0.to_owned()).or_insert(0) += 1;
        }
    }
    m
}

// Regression (adversarial review): the claim-ahead size came from one mean of past run times, so
// after 4000 tiny shards an executor claimed the 500-ms shards of the next task 1000 at a time:
// an idle executor beside it got none, and the tiny task's aggregation job waited behind them.
// Running shards that go quiet for long are taken as slow, and what waits beyond the new target
// is given back; under a rate limit nothing waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_task_after_a_fast_one_is_not_hoarded() {
    let env = RuntimeEnv::start().await;
    let a = env.executor(config("a"), Registry::with_builtins()).await; // concurrency 4
    env.dispatch(&TaskSpec::new("tiny", "noop", 4000)).await;
    env.dispatch(&spec("long", "sleep", 60, json!({ "ms": 500 }))).await;
    eventually_async("every tiny shard done", PATIENCE, || async { env.task("tiny").await.done == 4000 }).await;
    let since = std::time::Instant::now();
    eventually_async("tiny to end", PATIENCE, || async { env.task("tiny").await.state == TaskState::Completed }).await;
    assert!(since.elapsed() < Duration::from_millis(1500), "tiny's aggregation waited {:?}", since.elapsed());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = held_by_instance(&env, "long").await;
    assert!(held.values().all(|&n| n <= 6), "a holds far more than its 4 slots: {held:?}");
    // an idle executor arriving gets work at once
    let b = env.executor(config("b"), Registry::with_builtins()).await;
    eventually_async("b to hold long shards", PATIENCE, || async { held_by_instance(&env, "long").await.len() == 2 })
        .await;

    // a rate limit of 2 starts per second: once the shards running end, at most 2 per second
    let mut con = env.con.clone();
    let limit = shardctl_common::control::RateLimit { max: 2, per: Duration::from_secs(1) };
    shardctl_common::control::set_limit(&mut con, &env.keys, Some(limit)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = env.task("long").await.done;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let ended = env.task("long").await.done - before;
    assert!(ended <= 6, "{ended} shards ended in 2 s under a limit of 2 per second");
    a.stop().await;
    b.stop().await;
}
