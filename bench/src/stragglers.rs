//! Stragglers (issue 37, docs/design/speculation.md): 400 shards of the built-in `sleep` kind at
//! 50 ms on 4 executor processes of concurrency 4, the time from dispatch to `completed` (the
//! median of 3): with every node alike, with one node running every shard 100× slower
//! (`"slow_node"`, 5 s a shard), and the same with `--speculate`, with its backups. A batch ends
//! when its slowest shard ends: without backups one slow machine costs 3 to 4×; the target with
//! them is within 1.5× of no slow node.

use std::time::{Duration, Instant};

use anyhow::ensure;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};

use super::process;
use super::scenario::{median, Ctx, Figures};

const EXECUTORS: usize = 4;
const SHARDS: u64 = 400;
/// The node that runs every shard 100× slower.
const SLOW: &str = "bench-straggler-3";

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut children = Vec::new();
    let measured = async {
        for i in 0..EXECUTORS {
            children.push(process::executor(ctx, &format!("bench-straggler-{i}"), &["--concurrency", "4"])?);
        }
        // warm: every executor claiming
        task(ctx, false, false).await?;
        let (mut even, mut slow, mut spec, mut backups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            even.push(task(ctx, false, false).await?.0);
            slow.push(task(ctx, true, false).await?.0);
            let (ms, b) = task(ctx, true, true).await?;
            spec.push(ms);
            backups.push(b);
        }
        let (even, slow, spec) = (median(even), median(slow), median(spec));
        Ok::<_, anyhow::Error>(Figures::from([
            ("even_ms", even),
            ("one_slow_ms", slow),
            ("ratio", slow / even),
            ("speculate_ms", spec),
            ("speculate_ratio", spec / even),
            ("backups", median(backups)),
        ]))
    }
    .await;
    for c in &mut children {
        process::terminate(c).await;
    }
    measured
}

/// One 400-shard task, one node 100× slower when `slow`, with backups when `speculate`: ms from
/// dispatch to `completed`, and the backups started.
async fn task(ctx: &mut Ctx, slow: bool, speculate: bool) -> anyhow::Result<(f64, f64)> {
    let payload =
        if slow { format!(r#"{{"ms":50,"slow_node":"{SLOW}","slow_factor":100}}"#) } else { r#"{"ms":50}"#.into() };
    let spec = TaskSpec {
        payload,
        speculate: speculate.then_some(shardctl_common::failure::Threshold::Percent(10.0)),
        ..TaskSpec::new(new_task_id(), "sleep", SHARDS)
    };
    let start = Instant::now();
    create_task(&mut ctx.con, &ctx.keys, &spec).await?;
    let ended =
        super::stats::wait_ended(&mut ctx.con, &ctx.keys, &spec.id, Duration::from_millis(1), Duration::from_secs(300))
            .await?;
    ensure!(ended.state == "completed", "the task ended {}", ended.state);
    let t = shardctl_coordinator::progress::task(&mut ctx.con, &ctx.keys, &spec.id).await?;
    ensure!(t.done == SHARDS, "{} of {SHARDS} shards done", t.done);
    Ok((ended.at.duration_since(start).as_secs_f64() * 1000.0, t.spec_started as f64))
}
