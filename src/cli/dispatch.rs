//! `shardctl dispatch`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_common::ring::Strategy;
use shardctl_common::Error;
use shardctl_coordinator::dispatch::{dispatch, new_task_id, read_keys_file};

use super::args::{connect, duration, Args};
use super::task_args::TaskArgs;

#[derive(Debug, Parser)]
pub struct DispatchArgs {
    #[command(flatten)]
    pub task: TaskArgs,
    /// Task id (default: generated); 1-64 characters of A-Z a-z 0-9 . _ -
    #[arg(long)]
    pub task_id: Option<String>,
    /// Nothing of the task is claimable before this much time has passed.
    #[arg(long, value_parser = duration)]
    pub delay: Option<Duration>,
    /// One routing key per line, one shard per key (routed strategies).
    #[arg(long, value_name = "FILE")]
    pub keys_file: Option<std::path::PathBuf>,
    /// Wait for the task to end (progress bar on stderr), then print its result.
    #[arg(long)]
    pub wait: bool,
    /// Queue the task even though live executors run and none of them serves its kind: its
    /// shards wait (no executor that does not serve the kind claims them) until one that serves
    /// it starts; `status` and `wait` say so meanwhile.
    #[arg(long)]
    pub unserved: bool,
    /// With --wait: give up after this long.
    #[arg(long, value_parser = duration, requires = "wait")]
    pub timeout: Option<Duration>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &DispatchArgs) -> anyhow::Result<ExitCode> {
    let shard_keys = a.keys_file.as_deref().map(read_keys_file).transpose()?;
    let shards = match (&shard_keys, a.task.shards) {
        (Some(k), Some(n)) if k.len() as u64 != n => {
            return Err(Error::invalid(format!("--shards {n} but the keys file has {} keys", k.len())).into())
        }
        (Some(k), _) => k.len() as u64,
        (None, Some(n)) => n,
        (None, None) => return Err(Error::invalid("--shards N is required (or --keys-file)").into()),
    };
    let mut spec = a.task.spec(a.task_id.clone().unwrap_or_else(new_task_id), shards)?;
    spec.has_keys = shard_keys.is_some();
    spec.delay = a.delay.filter(|d| !d.is_zero());
    // check before connecting: bad input is reported as such even without Redis
    spec.validate()?;
    if spec.has_keys && spec.strategy == Strategy::Pull {
        return Err(
            Error::invalid("--keys-file needs a routed --strategy (consistent-hash, round-robin, hash-mod)").into()
        );
    }
    let (_, mut con) = connect(args).await?;
    // a kind no live executor serves would wait forever: a typo (`prime`) is said at once
    if let Some(said) = shardctl_coordinator::membership::unserved(&mut con, &args.home()?, &spec.kind).await? {
        if !a.unserved {
            let what = "start an executor that serves it, or give --unserved to queue it anyway";
            return Err(Error::invalid(format!("{said} ({what})")).into());
        }
        eprintln!("note: {said}; its shards wait until an executor serving it starts");
    }
    let d = dispatch(&mut con, &args.home()?, &spec, shard_keys.as_deref()).await?;
    if a.delay.is_some_and(|d| !d.is_zero()) {
        eprintln!(
            "delayed: nothing of it is claimable for {}",
            humantime::format_duration(a.delay.unwrap_or_default())
        );
    } else if let Some(placed) = shardctl::text::placed(&d, &spec) {
        eprintln!("{placed}");
    }
    if a.json && !a.wait {
        outln!("{}", serde_json::json!({ "task_id": spec.id }));
    } else if !a.json {
        outln!("{}", spec.id);
    }
    if !a.wait {
        return Ok(ExitCode::SUCCESS);
    }
    super::wait::wait_or_interrupt(&mut con, args, &spec.id, a.timeout, a.json).await
}
