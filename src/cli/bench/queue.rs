//! Throughput scenarios: end to end with one executor, and dispatch alone (pull and routed).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use shardctl_common::model::TaskSpec;
use shardctl_common::ring::Strategy;
use shardctl_coordinator::dispatch::{dispatch, dispatch_any, new_task_id};
use shardctl_coordinator::membership::{self, Member, MembershipConfig};
use shardctl_coordinator::sweep::{self, SweepConfig};
use shardctl_executor::{Executor, ExecutorConfig, Registry};
use tokio_util::sync::CancellationToken;

use super::{stats, Ctx, Figures};

/// Concurrency of the end-to-end executor.
const E2E_CONCURRENCY: usize = 1024;
/// Live members of the routed dispatch.
const ROUTED_MEMBERS: usize = 8;

/// N no-op pull shards through one executor (concurrency 1024) with the sweep loop beside it,
/// from dispatch to `completed`.
pub(crate) async fn e2e(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let n = ctx.shards;
    let keys = ctx.keys.clone();
    let stop = CancellationToken::new();
    let cfg = ExecutorConfig { node_id: "bench-e2e".into(), concurrency: E2E_CONCURRENCY, ..Default::default() };
    let ex = Executor::connect(ctx.client.clone(), keys.clone(), cfg, Registry::with_builtins()).await?;
    let running = tokio::spawn(ex.run(stop.clone()));
    let sweeper = tokio::spawn(sweep::run(ctx.con.clone(), keys.clone(), SweepConfig::default(), stop.clone(), |_| {}));
    let measured = async {
        // the executor has found nothing and waits on its marker: nothing else is going on
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(10)).await?;
        let mut con = ctx.con.clone();
        stats::reset_stats(&mut con).await?;
        let before = stats::info(&mut con).await?;
        let cpu_before = stats::process_cpu_s();
        let spec = TaskSpec::new(new_task_id(), "noop", n);
        let start = Instant::now();
        dispatch(&mut con, &keys, &spec).await?;
        let dispatched = stats::used_memory(&mut con).await?;
        let timeout = Duration::from_secs(60) + Duration::from_millis(n);
        let ended = stats::wait_ended(&mut con, &keys, &spec.id, Duration::from_millis(5), timeout).await?;
        let secs = ended.at.duration_since(start).as_secs_f64();
        let after = stats::info(&mut con).await?;
        let cpu = stats::process_cpu_s().zip(cpu_before).map(|(a, b)| a - b);
        ensure!(
            ended.state == "completed" && ended.done == n,
            "task ended {} with {} of {n} shards done",
            ended.state,
            ended.done
        );
        let d = after.since(&before);
        let per = |x: f64| x / n as f64;
        let mut f = Figures::from([
            ("secs", secs),
            ("shards_per_s", n as f64 / secs),
            ("cpu_us_per_shard", per(d.cpu_us)),
            ("script_calls_per_shard", per(d.scripts() as f64)),
            ("commands_per_shard", per(d.commands().saturating_sub(ended.polls) as f64)),
            ("bytes_per_shard", per(dispatched as f64 - before.used_memory as f64)),
            ("peak_bytes_per_shard", per(ended.peak_memory.max(dispatched) as f64 - before.used_memory as f64)),
        ]);
        if let Some(cpu) = cpu {
            // the executor, its sweep loop and this waiter: the process Redis is serving
            f.insert("executor_cpu_us_per_shard", per(cpu * 1e6));
            f.insert("executor_cores", cpu / secs);
        }
        Ok::<_, anyhow::Error>(f)
    }
    .await;
    stop.cancel();
    let stopped = running.await;
    let _ = sweeper.await;
    let figures = measured?;
    let st = stopped??;
    if st.refused + st.duplicates + st.locks_lost + st.redis_errors > 0 {
        bail!("the executor saw trouble: {st:?}");
    }
    Ok(figures)
}

/// Dispatch of N pull shards: one script call, whatever N. Measured twice: the first task of a
/// fresh queue (which creates the queue's keys, the event stream among them: Redis preallocates
/// 4 KB for a stream's first node), then a second task, the cost of one more task.
pub(crate) async fn dispatch_pull(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut con = ctx.con.clone();
    let mut once = async || {
        let spec = TaskSpec::new(new_task_id(), "noop", ctx.shards);
        let before = stats::used_memory(&mut con).await?;
        let start = Instant::now();
        dispatch(&mut con, &ctx.keys, &spec).await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let after = stats::used_memory(&mut con).await?;
        Ok::<_, anyhow::Error>((ms, after as f64 - before as f64))
    };
    let (fresh_ms, fresh_bytes) = once().await?;
    let (ms, bytes) = once().await?;
    Ok(Figures::from([("ms", ms), ("bytes", bytes), ("fresh_ms", fresh_ms), ("fresh_bytes", fresh_bytes)]))
}

/// Dispatch of N shards by consistent hash over 8 live members (registered, none running).
pub(crate) async fn dispatch_routed(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let n = ctx.shards;
    let mut con = ctx.con.clone();
    let mcfg = MembershipConfig::default();
    for i in 0..ROUTED_MEMBERS {
        let m = Member {
            node: format!("bench-node-{i}"),
            instance: uuid::Uuid::new_v4().simple().to_string(),
            host: shardctl_executor::config::hostname(),
            pid: std::process::id(),
            concurrency: 16,
        };
        membership::join(&mut con, &ctx.keys, &m, &mcfg).await?;
    }
    let spec = TaskSpec { strategy: Strategy::ConsistentHash, ..TaskSpec::new(new_task_id(), "noop", n) };
    stats::reset_stats(&mut con).await?;
    let before = stats::info(&mut con).await?;
    let start = Instant::now();
    let d = dispatch_any(&mut con, &ctx.keys, &spec, None).await?;
    let secs = start.elapsed().as_secs_f64();
    let after = stats::info(&mut con).await?;
    ensure!(
        d.placed == n && d.live == ROUTED_MEMBERS,
        "placed {} of {n} shards on {} of {ROUTED_MEMBERS} members",
        d.placed,
        d.live
    );
    let calls = after.since(&before);
    Ok(Figures::from([
        ("secs", secs),
        ("shards_per_s", n as f64 / secs),
        ("bytes_per_shard", (after.used_memory as f64 - before.used_memory as f64) / n as f64),
        ("script_calls", calls.scripts() as f64),
    ]))
}
