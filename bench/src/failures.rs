//! When shards fail (issue 36, docs/design/failure-policies.md): the newcomer's nightly report,
//! 600 shards of which 60 hit malformed input, the same on every attempt (the built-in `fail`
//! kind with `"sticky": true`, rate 0.1), 3 attempts with an exponential 1 s backoff, on 2
//! executor processes of concurrency 8. The time from dispatch to the failed verdict: as today
//! (each failure retried per the backoff), with the failures classified `permanent`, and with
//! `permanent` and `--max-failures 10` (the median of 3 each).

use std::time::{Duration, Instant};

use anyhow::ensure;
use shardctl_common::failure::Threshold;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};

use super::process;
use super::scenario::{median, Ctx, Figures};

const EXECUTORS: usize = 2;
const SHARDS: u64 = 600;

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut children = Vec::new();
    let measured = async {
        for i in 0..EXECUTORS {
            children.push(process::executor(ctx, &format!("bench-failures-{i}"), &["--concurrency", "8"])?);
        }
        let (mut retried, mut permanent, mut fast) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            retried.push(verdict(ctx, "retry", None).await?);
            permanent.push(verdict(ctx, "permanent", None).await?);
            fast.push(verdict(ctx, "permanent", Some(10)).await?);
        }
        let (retried, permanent, fast) = (median(retried), median(permanent), median(fast));
        Ok::<_, anyhow::Error>(Figures::from([
            ("retried_ms", retried),
            ("permanent_ms", permanent),
            ("fail_fast_ms", fast),
            ("speedup", retried / fast),
        ]))
    }
    .await;
    for c in &mut children {
        process::terminate(c).await;
    }
    measured
}

/// One 600-shard task whose sticky failures are of `class`: ms from dispatch to `failed`.
async fn verdict(ctx: &mut Ctx, class: &str, max_failures: Option<u64>) -> anyhow::Result<f64> {
    let spec = TaskSpec {
        payload: format!(r#"{{"rate":0.1,"sticky":true,"class":"{class}"}}"#),
        max_failures: max_failures.map(Threshold::Count),
        ..TaskSpec::new(new_task_id(), "fail", SHARDS)
    };
    let start = Instant::now();
    create_task(&mut ctx.con, &ctx.keys, &spec).await?;
    let ended =
        super::stats::wait_ended(&mut ctx.con, &ctx.keys, &spec.id, Duration::from_millis(1), Duration::from_secs(120))
            .await?;
    ensure!(ended.state == "failed", "the task ended {}", ended.state);
    let t = shardctl_coordinator::progress::task(&mut ctx.con, &ctx.keys, &spec.id).await?;
    ensure!(t.halted.is_some() == max_failures.is_some(), "halted: {:?}", t.halted);
    Ok(ended.at.duration_since(start).as_secs_f64() * 1000.0)
}
