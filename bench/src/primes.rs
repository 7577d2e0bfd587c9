//! Coordination overhead on real work: the primes below 2×10^8 in 2000 shards on two executor
//! processes of concurrency 1 (other flags default: claim-ahead on), against the same 2000 ranges
//! counted by two plain threads taking the next range as they go (what rayon's `par_iter` does,
//! without the dependency); then again with `--prefetch 0`, claiming only for a free slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use serde_json::json;
use shardctl_common::model::TaskSpec;
use shardctl_common::split::shard_range;
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use shardctl_executor::builtin::count_primes;

use super::scenario::{Ctx, Figures};
use super::{process, stats};

const ITEMS: u64 = 200_000_000;
const SHARDS: u64 = 2000;
/// Executor processes, and threads of the plain program.
const WORKERS: usize = 2;

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let (plain_secs, expected) = tokio::task::spawn_blocking(plain).await?;
    let (secs, redis) = executors(ctx, expected, None).await?;
    let (prefetch_secs, _) = executors(ctx, expected, Some(0)).await?;
    // per shard, in one worker's time: the work, and what the executors spent on top of it
    let per_shard = |s: f64| s * WORKERS as f64 / SHARDS as f64 * 1e6;
    Ok(Figures::from([
        ("executors_secs", secs),
        ("plain_secs", plain_secs),
        ("ratio_pct", plain_secs / secs * 100.0),
        ("prefetch_secs", prefetch_secs),
        ("prefetch_ratio_pct", plain_secs / prefetch_secs * 100.0),
        ("work_us_per_shard", per_shard(plain_secs)),
        ("overhead_us_per_shard", per_shard(secs - plain_secs)),
        ("prefetch_overhead_us_per_shard", per_shard(prefetch_secs - plain_secs)),
        ("cpu_us_per_shard", redis.cpu_us / SHARDS as f64),
        // Redis runs on the same 2 cores as the handlers: the ratio cannot pass this
        ("bound_pct", plain_secs / (plain_secs + redis.cpu_us / 1e6 / WORKERS as f64) * 100.0),
        ("script_calls_per_shard", redis.scripts() as f64 / SHARDS as f64),
    ]))
}

/// One primes task on WORKERS executor processes of concurrency 1 with `--prefetch` (default when
/// `None`): its time and what Redis did meanwhile.
async fn executors(ctx: &mut Ctx, expected: u64, prefetch: Option<usize>) -> anyhow::Result<(f64, stats::Delta)> {
    let mut children = Vec::new();
    let measured = async {
        for i in 0..WORKERS {
            let node = format!("bench-primes-{i}");
            let mut args = vec!["--concurrency".to_owned(), "1".to_owned()];
            if let Some(p) = prefetch {
                args.extend(["--prefetch".to_owned(), p.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let child = process::executor(ctx, &node, &args)?;
            children.push(child);
        }
        stats::wait_blocked(&mut ctx.con, WORKERS as u64, Duration::from_secs(30)).await?;
        let mut con = ctx.con.clone();
        let spec = TaskSpec { items: ITEMS, ..TaskSpec::new(new_task_id(), "primes", SHARDS) };
        let before = stats::info(&mut con).await?;
        let start = Instant::now();
        create_task(&mut con, &ctx.keys, &spec).await?;
        let ended =
            stats::wait_ended(&mut con, &ctx.keys, &spec.id, Duration::from_millis(5), Duration::from_secs(600))
                .await?;
        let secs = ended.at.duration_since(start).as_secs_f64();
        let redis = stats::info(&mut con).await?.since(&before);
        let t = shardctl_coordinator::progress::task(&mut con, &ctx.keys, &spec.id).await?;
        ensure!(
            ended.state == "completed" && t.result == Some(json!({ "primes": expected })),
            "task ended {} with result {:?}; a direct count gives {expected}",
            ended.state,
            t.result
        );
        Ok::<_, anyhow::Error>((secs, redis))
    }
    .await;
    for c in &mut children {
        process::terminate(c).await;
    }
    measured
}

/// The plain program: WORKERS threads over the same ranges. Returns its time and the count.
fn plain() -> (f64, u64) {
    let next = AtomicU64::new(0);
    let total = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= SHARDS {
                    break;
                }
                let r = shard_range(i, SHARDS, ITEMS);
                total.fetch_add(count_primes(r.start, r.end), Ordering::Relaxed);
            });
        }
    });
    (start.elapsed().as_secs_f64(), total.load(Ordering::Relaxed))
}
