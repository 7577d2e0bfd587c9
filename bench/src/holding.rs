//! What executors cost while they wait or hold: 100 idle executors, and one executor keeping
//! 10,000 in-flight shards alive.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts;
use shardctl_common::{conn, Home};
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use shardctl_executor::config::DEFAULT_BLOCK_TIMEOUT;
use shardctl_executor::{Executor, ExecutorConfig, Registry};
use tokio_util::sync::CancellationToken;

use super::scenario::{Ctx, Figures};
use super::stats;

/// Idle executors.
const IDLE: usize = 100;
/// Shards held by the upkeep executor.
const HELD: u64 = 10_000;
const UPKEEP_LOCK: Duration = Duration::from_secs(2);
const UPKEEP_RENEW: Duration = Duration::from_secs(1);
/// Heartbeats measured.
const UPKEEP_BEATS: u32 = 5;

/// 100 idle executors (each with its own client and default block timeout) over two block
/// timeouts, measured from the middle of one so that every executor's wake-ups fall inside.
pub(crate) async fn idle(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let stop = CancellationToken::new();
    let mut running = Vec::with_capacity(IDLE);
    let started = async {
        for i in 0..IDLE {
            let cfg = ExecutorConfig { node_id: format!("bench-idle-{i}"), ..Default::default() };
            let endpoint = conn::open(&ctx.url)?;
            let ex = Executor::connect(endpoint, ctx.keys.clone(), cfg, Registry::with_builtins()).await?;
            running.push(tokio::spawn(ex.run(stop.clone())));
        }
        stats::wait_blocked(&mut ctx.con, IDLE as u64, Duration::from_secs(30)).await
    }
    .await;
    let measured = async {
        started?;
        let block = DEFAULT_BLOCK_TIMEOUT;
        tokio::time::sleep(block / 2).await;
        let mut con = ctx.con.clone();
        let before = stats::info(&mut con).await?;
        tokio::time::sleep(block * 2).await;
        let after = stats::info(&mut con).await?;
        let d = after.since(&before);
        let periods = IDLE as f64 * d.secs / block.as_secs_f64();
        let bzpopmin = d.of("bzpopmin") as f64;
        Ok::<_, anyhow::Error>(Figures::from([
            ("window_secs", d.secs),
            ("bzpopmin_per_block", bzpopmin / periods),
            ("sent_per_block", (bzpopmin + d.scripts() as f64) / periods),
            ("commands_per_block", d.commands() as f64 / periods),
            ("cpu_pct", d.cpu_us / 1e6 / d.secs * 100.0),
        ]))
    }
    .await;
    stop.cancel();
    for r in running {
        r.await??;
    }
    measured
}

/// One executor holding 10,000 `sleep` shards under a 2 s lock renewed every second: script
/// calls over five heartbeats, every shard still held (and not stalled) after them, all
/// released at shutdown.
pub(crate) async fn upkeep(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let keys = ctx.keys.clone();
    let cfg = ExecutorConfig {
        node_id: "bench-upkeep".into(),
        concurrency: HELD as usize,
        lock_duration: UPKEEP_LOCK,
        lock_renew: UPKEEP_RENEW,
        grace: Duration::from_millis(200),
        ..Default::default()
    };
    let instance = cfg.instance.clone();
    let ex = Executor::connect(ctx.endpoint.clone(), keys.clone(), cfg, Registry::with_builtins()).await?;
    let live = ex.stats();
    let mut con = ctx.con.clone();
    let spec = TaskSpec { payload: r#"{"ms":600000}"#.into(), ..TaskSpec::new(new_task_id(), "sleep", HELD) };
    create_task(&mut con, &keys, &spec).await?;
    let stop = CancellationToken::new();
    // the heartbeat ticks every UPKEEP_RENEW from here on
    let t0 = Instant::now();
    let running = tokio::spawn(ex.run(stop.clone()));
    let measured = async {
        while live.snapshot().claimed < HELD {
            ensure!(t0.elapsed() < Duration::from_secs(60), "only {} shards claimed in 60s", live.snapshot().claimed);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let claim_secs = t0.elapsed().as_secs_f64();
        // a window of exactly UPKEEP_BEATS ticks, starting half-way between two
        let renew = UPKEEP_RENEW.as_secs_f64();
        let start = t0 + Duration::from_secs_f64(((claim_secs / renew).ceil() + 0.5) * renew);
        tokio::time::sleep_until(start.into()).await;
        let before = stats::info(&mut con).await?;
        tokio::time::sleep_until((start + UPKEEP_RENEW * UPKEEP_BEATS).into()).await;
        let after = stats::info(&mut con).await?;
        let d = after.since(&before);
        let held = held_by(&mut con, &keys, &instance).await?;
        let lease_ms = scripts::lease_left_ms(&mut con, &keys, &instance).await?;
        ensure!(lease_ms.is_some(), "the executor's lease is gone");
        // a sweep now must find nothing to mark: every holder's lease is alive
        let sweep = scripts::sweep(&mut con, &keys, 1, 1).await?.report.context("sweep throttled")?;
        Ok::<_, anyhow::Error>(Figures::from([
            ("claim_secs", claim_secs),
            ("scripts_per_beat", d.scripts() as f64 / f64::from(UPKEEP_BEATS)),
            ("commands_per_beat", d.commands() as f64 / f64::from(UPKEEP_BEATS)),
            ("held", held as f64),
            ("locks_lost", live.snapshot().locks_lost as f64),
            ("marked", sweep.marked as f64),
        ]))
    }
    .await;
    let down = Instant::now();
    stop.cancel();
    let st = running.await??;
    let shutdown_secs = down.elapsed().as_secs_f64();
    let mut figures = measured?;
    let still_held = held_by(&mut con, &keys, &instance).await?;
    let waiting: u64 = redis::cmd("LLEN").arg(keys.lane_wait("sleep")).query_async(&mut con).await?;
    if still_held > 0 || waiting != st.released {
        bail!("after shutdown {still_held} shards are still held and {waiting} wait (released {})", st.released);
    }
    figures.insert("released", st.released as f64);
    figures.insert("shutdown_secs", shutdown_secs);
    Ok(figures)
}

/// Shards in `active` held by tokens of `instance`.
async fn held_by(con: &mut shardctl_common::conn::Conn, home: &Home, instance: &str) -> anyhow::Result<u64> {
    let active: HashMap<String, String> = redis::cmd("HGETALL").arg(home.active()).query_async(con).await?;
    let prefix = format!("{instance}:");
    Ok(active.iter().filter(|(r, t)| r.as_str() != ACTIVE_PIN && t.starts_with(&prefix)).count() as u64)
}
