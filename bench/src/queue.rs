//! Throughput scenarios: end to end with one executor process, and dispatch alone (pull and routed).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use shardctl_common::model::TaskSpec;
use shardctl_common::ring::Strategy;
use shardctl_coordinator::dispatch::{create_task, dispatch, new_task_id};
use shardctl_coordinator::membership::{self, Member, MembershipConfig};

use super::scenario::{Ctx, Figures};
use super::{process, stats};

/// Live members of the routed dispatch.
const ROUTED_MEMBERS: usize = 8;

/// N no-op pull shards through one executor process started with default flags (the command
/// line an operator would use, its own stalled sweep included), from dispatch to `completed`.
/// The executor's CPU is that of its whole process, from /proc.
pub(crate) async fn e2e(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    Ok(e2e_with_delta(ctx).await?.0)
}

/// [`e2e`], and what Redis did from just before the dispatch to the task's end (`INFO` before
/// and after: the `durability` scenario counts its `WAIT`s there).
pub(crate) async fn e2e_with_delta(ctx: &mut Ctx) -> anyhow::Result<(Figures, stats::Delta)> {
    let n = ctx.shards;
    let keys = ctx.keys.clone();
    let mut child = process::executor(ctx, "bench-e2e", &[])?;
    let pid = process::pid(&child)?.to_string();
    let measured = async {
        // the executor has found nothing and waits on its marker: nothing else is going on
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
        let mut con = ctx.con.clone();
        stats::reset_stats(&mut con).await?;
        let before = stats::info(&mut con).await?;
        let cpu_before = process::cpu_s(&pid);
        let spec = TaskSpec::new(new_task_id(), "noop", n);
        let start = Instant::now();
        create_task(&mut con, &keys, &spec).await?;
        let dispatched = stats::used_memory(&mut con).await?;
        let timeout = Duration::from_secs(60) + Duration::from_millis(n);
        let ended = tokio::select! {
            ended = stats::wait_ended(&mut con, &keys, &spec.id, Duration::from_millis(5), timeout) => ended?,
            status = child.wait() => bail!("the executor process exited during the run ({})", status?),
        };
        let cpu = process::cpu_s(&pid).zip(cpu_before).map(|(a, b)| a - b);
        let secs = ended.at.duration_since(start).as_secs_f64();
        let after = stats::info(&mut con).await?;
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
            f.insert("executor_cpu_us_per_shard", per(cpu * 1e6));
            f.insert("executor_cores", cpu / secs);
        }
        // what the dashboard's shard map of this task costs: its bitmap in 64 KiB chunks, its
        // held refs and reasons by HSCAN, cells made and sent as JSON
        let start = Instant::now();
        let t = shardctl_coordinator::progress::task(&mut con, &keys, &spec.id).await?;
        let map =
            shardctl_coordinator::shard_map::shard_map(&mut con, &keys, &t, shardctl_coordinator::shard_map::MAX_CELLS)
                .await?;
        let sent = serde_json::to_string(&map)?.len();
        f.insert("map_ms", start.elapsed().as_secs_f64() * 1e3);
        f.insert("map_bytes", sent as f64);
        // the whole task page (docs/design/dashboard.md): the task with its run times and
        // completions over time, its map, a page of reasons, its failures by cause, the executors
        let start = Instant::now();
        let t = shardctl_coordinator::progress::task(&mut con, &keys, &spec.id).await?;
        shardctl_coordinator::shard_map::shard_map(&mut con, &keys, &t, shardctl_coordinator::shard_map::MAX_CELLS)
            .await?;
        shardctl_coordinator::inspect::reason_page(&mut con, &keys, &t, "0", 50).await?;
        shardctl_coordinator::failures::groups(&mut con, &keys, &t).await?;
        shardctl_coordinator::progress::nodes(&mut con, &keys).await?;
        f.insert("page_ms", start.elapsed().as_secs_f64() * 1e3);
        Ok::<_, anyhow::Error>((f, d))
    }
    .await;
    process::terminate(&mut child).await;
    measured
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
        create_task(&mut con, &ctx.keys, &spec).await?;
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
            kinds: "*".to_owned(),
            live: None,
        };
        membership::join(&mut con, &ctx.keys, &m, &mcfg).await?;
    }
    let spec = TaskSpec { strategy: Strategy::ConsistentHash, ..TaskSpec::new(new_task_id(), "noop", n) };
    stats::reset_stats(&mut con).await?;
    let before = stats::info(&mut con).await?;
    let start = Instant::now();
    let d = dispatch(&mut con, &ctx.keys, &spec, None).await?;
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
