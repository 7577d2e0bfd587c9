//! Failover (issue 12): an executor process holding shards is SIGKILLed; how long until another
//! executor process holds every one of them. Both run with `--lock-duration 5s` and the other
//! defaults (stalled interval 30 s), as an operator would start them; the target is the lock
//! duration plus one second, whatever the stalled interval.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use tokio::process::Child;

use super::scenario::{Ctx, Figures};
use super::{process, stats};

/// Shards the killed executor holds.
const SHARDS: u64 = 4;
/// The executors' lock duration.
const LOCK: &str = "5s";
/// Longest a trial may take before it counts as hung (the default stalled interval is 30 s, so
/// recovery takes up to lock + 2 × 30 s today).
const GUARD: Duration = Duration::from_secs(150);

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut children = Vec::new();
    let measured = trial(ctx, &mut children).await;
    for c in &mut children {
        let _ = c.kill().await;
    }
    measured
}

fn executor(ctx: &Ctx, node: &str) -> anyhow::Result<Child> {
    process::executor(ctx, node, &["--concurrency", &SHARDS.to_string(), "--lock-duration", LOCK])
}

/// The held shards: ref → the instance of its holder (the token without its `:<seq>`).
async fn holders(ctx: &mut Ctx) -> anyhow::Result<HashMap<String, String>> {
    let all: HashMap<String, String> = redis::cmd("HGETALL").arg(ctx.keys.active()).query_async(&mut ctx.con).await?;
    Ok(all
        .into_iter()
        .filter(|(r, _)| r != ACTIVE_PIN)
        .map(|(r, t)| (r, t.rsplit_once(':').map_or(t.clone(), |(i, _)| i.to_owned())))
        .collect())
}

async fn trial(ctx: &mut Ctx, children: &mut Vec<Child>) -> anyhow::Result<Figures> {
    children.push(executor(ctx, "bench-failover-a")?);
    stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
    let spec = TaskSpec { payload: r#"{"ms":600000}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", SHARDS) };
    create_task(&mut ctx.con, &ctx.keys, &spec).await?;
    let start = Instant::now();
    let victim = loop {
        let h = holders(ctx).await?;
        if h.len() as u64 == SHARDS {
            break h;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the first executor holds {} of {SHARDS} shards after 30 s", h.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    children.push(executor(ctx, "bench-failover-b")?);
    stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
    children[0].kill().await.context("SIGKILL of the first executor")?;
    let killed = Instant::now();
    loop {
        let h = holders(ctx).await?;
        let moved = victim.keys().filter(|r| h.get(*r).is_some_and(|i| Some(i) != victim.get(*r))).count();
        if moved as u64 == SHARDS {
            break;
        }
        if killed.elapsed() > GUARD {
            bail!("{moved} of {SHARDS} shards held elsewhere {GUARD:?} after the kill");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = killed.elapsed().as_secs_f64();
    shardctl_common::control::cancel(&mut ctx.con, &ctx.keys, &spec.id).await?;
    Ok(Figures::from([("secs", secs)]))
}
