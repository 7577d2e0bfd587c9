//! `shardctl bench`: its flags, the private redis-server, and the report printed
//! ([`shardctl_bench`] measures).

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use shardctl_bench::{self as bench, Options, Scenario};
use tokio_util::sync::CancellationToken;

use shardctl_bench::redis_server::RedisServer;

use super::{args::Args, exit};

#[derive(Debug, Parser)]
#[command(after_help = "\
Starts its own redis-server unless --redis is given; a --redis database must be empty: the bench \
flushes it between runs, resets the server's INFO stats and turns latency-tracking off while it runs. \
The BullMQ scenario needs node and npm: it installs bullmq and ioredis into /tmp/shardctl-bullmq once. \
The table goes to stdout, progress to stderr.")]
pub struct BenchArgs {
    /// Shards of the end-to-end and dispatch scenarios (BullMQ gets at most 200,000 jobs).
    #[arg(long, default_value_t = 1_000_000)]
    pub shards: u64,
    /// Runs of each scenario; the table shows the medians.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Run only these scenarios (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<Scenario>,
    /// Leave out the BullMQ comparison.
    #[arg(long)]
    pub no_bullmq: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    if a.shards < 1 || a.runs < 1 {
        return Err(shardctl_common::Error::invalid("--shards and --runs must be at least 1").into());
    }
    let mut scenarios: Vec<Scenario> =
        if a.only.is_empty() { Scenario::value_variants().to_vec() } else { a.only.clone() };
    scenarios.sort();
    scenarios.dedup();
    if a.no_bullmq {
        scenarios.retain(|&s| s != Scenario::Bullmq);
    }
    let exe = std::env::current_exe().context("finding this program to start executors")?;
    let opts = Options { shards: a.shards, runs: a.runs, scenarios, exe };
    let interrupted = CancellationToken::new();
    shardctl_executor::shutdown::cancel_on_signal(interrupted.clone());
    let given = args.given_redis()?;
    let (_server, url) = RedisServer::unless_given(&given)?;
    let report = tokio::select! {
        r = bench::run(&url, given.is_some(), &args.prefix, &args.queue, &opts) => r?,
        _ = interrupted.cancelled() => bail!("interrupted"),
    };
    if a.json {
        outln!("{}", report.to_json());
    } else {
        out!("{}", report.render());
    }
    Ok(if report.failed_runs > 0 { ExitCode::from(exit::ERROR) } else { ExitCode::SUCCESS })
}
