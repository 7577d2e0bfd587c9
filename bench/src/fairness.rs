//! Fair sharing between tasks (issue 35, docs/design/fairness.md): 2 executor processes of
//! concurrency 8, shards of the built-in `sleep` kind at 50 ms. A 16-shard task alone, then the
//! same task dispatched one second after a 3,200-shard one of the same priority: its time from
//! dispatch to `completed` in both (the median of 3 each), and the ratio. Before fair sharing it
//! waited for the whole big task (9,484 ms against 214 ms alone, 44×).
//!
//! Then two tasks of weights 1 and 3 side by side: the shards each holds, sampled every 10 ms
//! for 2 s (from `held`, what the claims decide by), and their ratio (the target is 3).

use std::time::{Duration, Instant};

use anyhow::ensure;
use serde_json::json;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};

use super::process;
use super::scenario::{median, Ctx, Figures};

const EXECUTORS: usize = 2;
const BIG: u64 = 3_200;
const SMALL: u64 = 16;

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut children = Vec::new();
    let measured = async {
        for i in 0..EXECUTORS {
            children.push(process::executor(ctx, &format!("bench-fair-{i}"), &["--concurrency", "8"])?);
        }
        // warm: both executors claiming
        small(ctx).await?;
        let mut alone = Vec::new();
        for _ in 0..3 {
            alone.push(small(ctx).await?);
        }
        let big = TaskSpec { payload: r#"{"ms":50}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", BIG) };
        create_task(&mut ctx.con, &ctx.keys, &big).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut behind = Vec::new();
        for _ in 0..3 {
            behind.push(small(ctx).await?);
        }
        let left = shardctl_coordinator::progress::task(&mut ctx.con, &ctx.keys, &big.id).await?;
        ensure!(left.done < BIG, "the big task ended before the small ones were measured");
        let ended = super::stats::wait_ended(
            &mut ctx.con,
            &ctx.keys,
            &big.id,
            Duration::from_millis(50),
            Duration::from_secs(300),
        )
        .await?;
        ensure!(ended.state == "completed" && ended.done == BIG, "the big task ended {}", ended.state);
        let (alone, behind) = (median(alone), median(behind));
        let weights = weights(ctx).await?;
        Ok::<_, anyhow::Error>(Figures::from([
            ("alone_ms", alone),
            ("behind_ms", behind),
            ("ratio", behind / alone),
            ("weight_ratio", weights),
        ]))
    }
    .await;
    for c in &mut children {
        process::terminate(c).await;
    }
    measured
}

/// One 16-shard `sleep` task: its time from dispatch to `completed`, in ms.
async fn small(ctx: &mut Ctx) -> anyhow::Result<f64> {
    let spec = TaskSpec { payload: r#"{"ms":50}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", SMALL) };
    let start = Instant::now();
    create_task(&mut ctx.con, &ctx.keys, &spec).await?;
    let ended =
        super::stats::wait_ended(&mut ctx.con, &ctx.keys, &spec.id, Duration::from_millis(1), Duration::from_secs(300))
            .await?;
    let ms = ended.at.duration_since(start).as_secs_f64() * 1000.0;
    let t = shardctl_coordinator::progress::task(&mut ctx.con, &ctx.keys, &spec.id).await?;
    ensure!(
        ended.state == "completed" && t.result == Some(json!({ "completed": SMALL, "failed": 0 })),
        "the small task ended {} with {:?}",
        ended.state,
        t.result
    );
    Ok(ms)
}

/// Two long tasks of weights 1 and 3: the ratio of the shards they hold, summed over samples.
async fn weights(ctx: &mut Ctx) -> anyhow::Result<f64> {
    let spec =
        |w: u32| TaskSpec { weight: w, payload: r#"{"ms":50}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", 4000) };
    let (one, three) = (spec(1), spec(3));
    create_task(&mut ctx.con, &ctx.keys, &one).await?;
    create_task(&mut ctx.con, &ctx.keys, &three).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut a, mut b) = (0u64, 0u64);
    for _ in 0..200 {
        let (x, y): (Option<u64>, Option<u64>) =
            redis::cmd("HMGET").arg(ctx.keys.held()).arg(&one.id).arg(&three.id).query_async(&mut ctx.con).await?;
        a += x.unwrap_or(0);
        b += y.unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in [&one, &three] {
        shardctl_common::control::cancel_in(&mut ctx.con, &ctx.keys, &t.id).await?;
    }
    ensure!(a > 0, "the weight-1 task held nothing");
    Ok(b as f64 / a as f64)
}
