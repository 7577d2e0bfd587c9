//! `shardctl cancel`, `retry`, `clean` and `limit`: controls over dispatched tasks and the queue.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_common::control::{self, RateLimit};
use shardctl_common::{Error, ScriptCode};

use super::args::{connect, duration, Args};

#[derive(Debug, Parser)]
pub struct TaskIdArg {
    /// The task id.
    pub task: String,
}

#[derive(Debug, Parser)]
pub struct CleanArgs {
    /// Also remove every task that ended at least this long ago (default: only tasks whose
    /// retention ran out).
    #[arg(long, value_parser = duration)]
    pub older_than: Option<Duration>,
}

#[derive(Debug, Parser)]
pub struct LimitArgs {
    /// At most this many shards start ...
    #[arg(long, requires = "per", conflicts_with = "off")]
    pub max: Option<u64>,
    /// ... in any window of this length (across every executor of the queue).
    #[arg(long, value_parser = duration, requires = "max")]
    pub per: Option<Duration>,
    /// Remove the limit.
    #[arg(long)]
    pub off: bool,
}

pub async fn cancel(args: &Args, a: &TaskIdArg) -> anyhow::Result<ExitCode> {
    let id = super::args::task_id(&a.task)?;
    let (_, mut con) = connect(args).await?;
    let stopped = control::cancel(&mut con, &args.home()?, id).await?;
    outln!("task {id} cancelled: {stopped} running shards are told to stop at their executors' next heartbeat");
    Ok(ExitCode::SUCCESS)
}

pub async fn retry(args: &Args, a: &TaskIdArg) -> anyhow::Result<ExitCode> {
    let id = super::args::task_id(&a.task)?;
    let (_, mut con) = connect(args).await?;
    let home = args.home()?;
    let before = shardctl_coordinator::progress::task(&mut con, &home, id).await?;
    let retried = shardctl_common::retry::retry(&mut con, &home, id).await.map_err(|e| match e.script_code() {
        // say which flag the task was dispatched with
        Some(c @ ScriptCode::ResultsDiscarded) => {
            Error::refused(c, format!("{e} (it was dispatched with --keep-results false)"))
        }
        _ => e,
    })?;
    outln!("{}", shardctl::text::retried(id, retried, &before));
    Ok(ExitCode::SUCCESS)
}

pub async fn clean(args: &Args, a: &CleanArgs) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let n = control::clean(&mut con, &args.home()?, a.older_than).await?;
    outln!("removed {n} ended task{} and {} keys", if n == 1 { "" } else { "s" }, if n == 1 { "its" } else { "their" });
    Ok(ExitCode::SUCCESS)
}

pub async fn limit(args: &Args, a: &LimitArgs) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let home = args.home()?;
    if a.off {
        control::set_limit(&mut con, &home, None).await?;
        outln!("queue {}: no rate limit", args.queue);
        return Ok(ExitCode::SUCCESS);
    }
    if let (Some(max), Some(per)) = (a.max, a.per) {
        if max == 0 {
            return Err(Error::invalid("--max must be at least 1 (use --off to remove the limit)").into());
        }
        if per < Duration::from_millis(1) {
            return Err(Error::invalid("--per must be at least 1ms").into());
        }
        control::set_limit(&mut con, &home, Some(RateLimit { max, per })).await?;
    }
    match control::limit(&mut con, &home).await? {
        Some(l) => {
            outln!("queue {}: at most {} shards start per {}", args.queue, l.max, humantime::format_duration(l.per))
        }
        None => outln!("queue {}: no rate limit", args.queue),
    }
    Ok(ExitCode::SUCCESS)
}
