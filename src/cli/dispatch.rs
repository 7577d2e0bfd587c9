//! `shardctl dispatch`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_common::backoff::Backoff;
use shardctl_common::model::{TaskSpec, DEFAULT_ATTEMPTS};
use shardctl_common::ring::{Strategy, DEFAULT_VNODES};
use shardctl_common::Error;
use shardctl_coordinator::dispatch::{dispatch_any, new_task_id};

use super::{connect, duration, Args};

#[derive(Debug, Parser)]
pub struct DispatchArgs {
    /// Number of shards (with --keys-file: the number of keys, if given it must match).
    #[arg(long, required_unless_present = "keys_file")]
    pub shards: Option<u64>,
    /// Number of items split over the shards (default: the number of shards).
    #[arg(long)]
    pub items: Option<u64>,
    /// Which handler runs the shards: primes, noop, sleep, fail, or one of yours (--exec).
    #[arg(long, default_value = "primes")]
    pub kind: String,
    /// Task id (default: generated); 1-64 characters of A-Z a-z 0-9 . _ -
    #[arg(long)]
    pub task_id: Option<String>,
    /// Task payload, JSON, at most 1 MiB; handlers get it on stdin.
    #[arg(long, default_value = "null", conflicts_with = "payload_file")]
    pub payload: String,
    /// Read the payload from this file (`-` for stdin) instead.
    #[arg(long, value_name = "FILE")]
    pub payload_file: Option<std::path::PathBuf>,
    /// Attempts per shard before it fails for good.
    #[arg(long, default_value_t = DEFAULT_ATTEMPTS)]
    pub attempts: u32,
    /// Delay between attempts: fixed:D or exponential:D (jittered).
    #[arg(long, default_value = "exponential:1s", value_parser = |s: &str| s.parse::<Backoff>())]
    pub backoff: Backoff,
    /// Higher runs first; among equal priorities, first dispatched first (-1000000..=1000000).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i64,
    /// An attempt running longer is cancelled and fails with "timed out" (default: no limit).
    #[arg(long, value_parser = duration)]
    pub shard_timeout: Option<Duration>,
    /// Placement: pull (competitive, the default), consistent-hash, round-robin or hash-mod.
    #[arg(long, default_value = "pull", value_parser = |s: &str| s.parse::<Strategy>())]
    pub strategy: Strategy,
    /// One routing key per line, one shard per key (routed strategies).
    #[arg(long, value_name = "FILE")]
    pub keys_file: Option<std::path::PathBuf>,
    /// Virtual nodes per executor on the consistent-hash ring.
    #[arg(long, default_value_t = DEFAULT_VNODES)]
    pub vnodes: u32,
    /// Executors whose membership heartbeat is older than this are not given shards.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub member_timeout: Duration,
    /// Wait for the task to end (progress bar on stderr), then print its result.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long.
    #[arg(long, value_parser = duration, requires = "wait")]
    pub timeout: Option<Duration>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &DispatchArgs) -> anyhow::Result<ExitCode> {
    let shard_keys = a.keys_file.as_deref().map(read_keys).transpose()?;
    let shards = match (&shard_keys, a.shards) {
        (Some(k), Some(n)) if k.len() as u64 != n => {
            return Err(Error::invalid(format!("--shards {n} but the keys file has {} keys", k.len())).into())
        }
        (Some(k), _) => k.len() as u64,
        (None, n) => n.unwrap_or(0),
    };
    let spec = TaskSpec {
        id: a.task_id.clone().unwrap_or_else(new_task_id),
        kind: a.kind.clone(),
        shards,
        items: a.items.unwrap_or(shards),
        payload: payload(a)?,
        attempts: a.attempts,
        backoff: a.backoff,
        priority: a.priority,
        strategy: a.strategy,
        vnodes: a.vnodes,
        has_keys: shard_keys.is_some(),
        shard_timeout: a.shard_timeout,
    };
    // check before connecting: bad input is reported as such even without Redis
    spec.validate()?;
    if spec.has_keys && spec.strategy == Strategy::Pull {
        return Err(
            Error::invalid("--keys-file needs a routed --strategy (consistent-hash, round-robin, hash-mod)").into()
        );
    }
    let (_, mut con) = connect(args).await?;
    let d = dispatch_any(&mut con, &args.keys(), &spec, shard_keys.as_deref(), a.member_timeout).await?;
    if spec.strategy != Strategy::Pull {
        let how = if d.resumed { "resumed: " } else { "" };
        if d.live == 0 {
            eprintln!("{how}no live executor: the shards wait unplaced until the first one joins");
        } else {
            eprintln!("{how}{} of {} shards placed on {} executors ({})", d.placed, spec.shards, d.live, spec.strategy);
        }
    }
    if a.json && !a.wait {
        println!("{}", serde_json::json!({ "task_id": spec.id }));
    } else if !a.json {
        println!("{}", spec.id);
    }
    if !a.wait {
        return Ok(ExitCode::SUCCESS);
    }
    super::wait::wait_and_print(&mut con, args, &spec.id, a.timeout, a.json).await
}

/// The payload from `--payload` or `--payload-file` (read up to one byte past the limit).
fn payload(a: &DispatchArgs) -> anyhow::Result<String> {
    use std::io::Read;
    let Some(path) = &a.payload_file else { return Ok(a.payload.clone()) };
    let limit = shardctl_common::model::MAX_PAYLOAD_BYTES as u64 + 1;
    let mut buf = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().take(limit).read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut buf))
    };
    read.map_err(|e| shardctl_common::Error::invalid(format!("cannot read payload file {}: {e}", path.display())))?;
    String::from_utf8(buf).map_err(|_| shardctl_common::Error::invalid("payload file is not UTF-8").into())
}

/// One key per non-empty line (trailing `\r` removed).
fn read_keys(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("cannot read keys file {}: {e}", path.display())))?;
    let keys: Vec<String> =
        text.lines().map(|l| l.trim_end_matches('\r')).filter(|l| !l.is_empty()).map(str::to_owned).collect();
    if keys.is_empty() {
        return Err(Error::invalid(format!("keys file {} has no keys", path.display())).into());
    }
    Ok(keys)
}
