//! `shardctl bench`: its flags, the private redis-server, and the report printed
//! ([`shardctl_bench`] measures).

use std::process::ExitCode;

use anyhow::{bail, Context};
use shardctl_bench::{self as bench, BenchArgs};
use tokio_util::sync::CancellationToken;

use shardctl_bench::redis_server::RedisServer;

use super::{args::Args, exit};

pub async fn run(args: &Args, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding this program to start executors")?;
    let opts = a.options(exe)?;
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
