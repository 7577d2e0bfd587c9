//! `shardctl demo`: a private redis-server, a primes task, K executor nodes in this process, a
//! progress bar, and the result checked against a direct count.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use clap::Parser;
use serde_json::json;
use shardctl::{Node, NodeConfig};
use shardctl_common::conn;
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use shardctl_executor::builtin::count_primes;
use shardctl_executor::{ExecutorConfig, Registry};
use tokio_util::sync::CancellationToken;

use shardctl_bench::redis_server::RedisServer;

use super::args::Args;

#[derive(Debug, Parser)]
pub struct DemoArgs {
    /// Number of shards.
    #[arg(long, default_value_t = 1000)]
    pub shards: u64,
    /// Count the primes below this number.
    #[arg(long, default_value_t = 10_000_000)]
    pub items: u64,
    /// Executors to run in this process.
    #[arg(long, default_value_t = 2)]
    pub executors: usize,
}

pub async fn run(args: &Args, a: &DemoArgs) -> anyhow::Result<ExitCode> {
    if a.executors < 1 {
        return Err(shardctl_common::Error::invalid("--executors must be at least 1").into());
    }
    // on SIGINT/SIGTERM stop waiting and shut everything down (the private server too)
    let interrupted = CancellationToken::new();
    shardctl_executor::shutdown::cancel_on_signal(interrupted.clone());
    let given = args.given_redis()?;
    let (_server, url) = RedisServer::unless_given(&given)?;
    let home = args.home()?;
    let endpoint = conn::open(&url)?;
    let mut con = endpoint.manager().await?;
    let spec = TaskSpec { items: a.items, ..TaskSpec::new(new_task_id(), "primes", a.shards) };
    create_task(&mut con, &home, &spec).await?;
    eprintln!(
        "dispatched task {} : primes below {} in {} shards; {} executors",
        spec.id, a.items, a.shards, a.executors
    );

    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    for i in 0..a.executors {
        let executor = ExecutorConfig { node_id: format!("demo-{i}"), concurrency: cores, ..Default::default() };
        let config = NodeConfig { executor, ..Default::default() };
        let node = Node::start(endpoint.clone(), home.clone(), config, Registry::with_builtins()).await?;
        runs.push(tokio::spawn(node.run(stop.clone())));
    }
    let start = Instant::now();
    let code = tokio::select! {
        c = super::wait::wait_and_print(&mut con, args, &spec.id, None, false) => c,
        _ = interrupted.cancelled() => Err(anyhow::anyhow!("interrupted")),
    };
    let elapsed = start.elapsed();
    stop.cancel();
    for r in runs {
        r.await??;
    }
    let code = code?;

    let t = shardctl_coordinator::progress::task(&mut con, &home, &spec.id).await?;
    let items = a.items;
    let expected = tokio::task::spawn_blocking(move || count_primes(0, items)).await?;
    let got = t.result.clone().unwrap_or_default();
    eprintln!("{:.0} shards/s", a.shards as f64 / elapsed.as_secs_f64());
    if got != json!({ "primes": expected }) {
        bail!("wrong result: got {got}, a direct count gives {expected}");
    }
    outln!("checked: {expected} primes below {items}, counted once each over {} shards", a.shards);
    Ok(code)
}
