//! Executor memory (issue 12): the resident set of one executor process started as an operator
//! would (`--concurrency 10000`, other flags default), idle and then holding 10,000 in-flight
//! `sleep` shards. RSS is `VmRSS` of `/proc/<pid>/status` (Linux only).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};

use super::scenario::{Ctx, Figures};
use super::{process, stats};

/// Shards in flight.
const IN_FLIGHT: u64 = 10_000;
/// Time the process gets to settle before each reading (allocations after the last claim, the
/// handlers' first poll).
const SETTLE: Duration = Duration::from_secs(1);
const MIB: f64 = 1024.0 * 1024.0;

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut child = process::executor(ctx, "bench-rss", &["--concurrency", &IN_FLIGHT.to_string()])?;
    let measured = async {
        let pid = process::pid(&child)?;
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
        tokio::time::sleep(SETTLE).await;
        let idle = process::rss_bytes(pid)?;
        let spec = TaskSpec { payload: r#"{"ms":600000}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", IN_FLIGHT) };
        create_task(&mut ctx.con, &ctx.keys, &spec).await?;
        let start = Instant::now();
        loop {
            let held = held(ctx).await?;
            if held >= IN_FLIGHT {
                break;
            }
            ensure!(start.elapsed() < Duration::from_secs(60), "{held} of {IN_FLIGHT} shards held after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(SETTLE).await;
        let in_flight = process::rss_bytes(pid)?;
        let still = held(ctx).await?;
        ensure!(still == IN_FLIGHT, "only {still} of {IN_FLIGHT} shards still held when RSS was read");
        shardctl_common::control::cancel(&mut ctx.con, &ctx.keys, &spec.id).await?;
        Ok::<_, anyhow::Error>(Figures::from([
            ("idle_mib", idle as f64 / MIB),
            ("in_flight_mib", in_flight as f64 / MIB),
            ("bytes_per_shard_in_flight", (in_flight as f64 - idle as f64) / IN_FLIGHT as f64),
        ]))
    }
    .await;
    if let Ok(Some(status)) = child.try_wait() {
        bail!("the executor process exited during the run ({status})");
    }
    // SIGKILL, not a graceful stop: the executor would learn of the cancel only at its next
    // heartbeat (15 s by default) and spend its 10 s grace on the sleeping shards first; the
    // database is flushed before the next run anyway
    let _ = child.kill().await;
    measured
}

/// Shards in `active` (whoever holds them: this executor is the only one).
async fn held(ctx: &mut Ctx) -> anyhow::Result<u64> {
    let (len, pinned): (u64, bool) = redis::pipe()
        .cmd("HLEN")
        .arg(ctx.keys.active())
        .cmd("HEXISTS")
        .arg(ctx.keys.active())
        .arg(ACTIVE_PIN)
        .query_async(&mut ctx.con)
        .await?;
    Ok(len - u64::from(pinned))
}
