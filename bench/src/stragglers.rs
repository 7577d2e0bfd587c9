//! Stragglers (issue 37): 400 shards of the built-in `sleep` kind at 50 ms on 4 executor
//! processes of concurrency 4, the time from dispatch to `completed` (the median of 3): with
//! every node alike, and with one node running every shard 100× slower (`"slow_node"`, 5 s a
//! shard). A batch ends when its slowest shard ends: the ratio is what one slow machine costs.

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
        task(ctx, false).await?;
        let (mut even, mut slow) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            even.push(task(ctx, false).await?);
            slow.push(task(ctx, true).await?);
        }
        let (even, slow) = (median(even), median(slow));
        Ok::<_, anyhow::Error>(Figures::from([("even_ms", even), ("one_slow_ms", slow), ("ratio", slow / even)]))
    }
    .await;
    for c in &mut children {
        process::terminate(c).await;
    }
    measured
}

/// One 400-shard task, one node 100× slower when `slow`: ms from dispatch to `completed`.
async fn task(ctx: &mut Ctx, slow: bool) -> anyhow::Result<f64> {
    let payload =
        if slow { format!(r#"{{"ms":50,"slow_node":"{SLOW}","slow_factor":100}}"#) } else { r#"{"ms":50}"#.into() };
    let spec = TaskSpec { payload, ..TaskSpec::new(new_task_id(), "sleep", SHARDS) };
    let start = Instant::now();
    create_task(&mut ctx.con, &ctx.keys, &spec).await?;
    let ended =
        super::stats::wait_ended(&mut ctx.con, &ctx.keys, &spec.id, Duration::from_millis(1), Duration::from_secs(300))
            .await?;
    ensure!(ended.state == "completed", "the task ended {}", ended.state);
    Ok(ended.at.duration_since(start).as_secs_f64() * 1000.0)
}
