//! `shardctl executor`: its flags made into a [`shardctl::NodeConfig`], and the node run.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl::{Node, NodeConfig};
use shardctl_common::kinds::Served;
use shardctl_coordinator::membership::MembershipConfig;
use shardctl_coordinator::sweep::{SweepConfig, DEFAULT_MAX_STALLED};
use shardctl_executor::child::DEFAULT_MAX_OUTPUT;
use shardctl_executor::commands::Commands;
use shardctl_executor::config::{self as cfg, ExecutorConfig};
use shardctl_executor::exit_codes::ExitCodes;

use super::args::{duration, Args};

#[derive(Debug, Parser)]
pub struct ExecutorArgs {
    /// This node's identity (default: hostname-pid).
    #[arg(long)]
    pub node_id: Option<String>,
    /// Shards run at once.
    #[arg(long, default_value_t = cfg::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Most shards claimed ahead of a free slot. The executor claims ahead what it would start
    /// within 20 ms at the rate it observes (none for long shards, hundreds for tiny ones), so
    /// that claims come in batches; they wait held and are given back at once at shutdown. Under
    /// a queue rate limit only shards that can start at once are claimed. 0: claim only for a
    /// free slot.
    #[arg(long, default_value_t = cfg::DEFAULT_PREFETCH)]
    pub prefetch: usize,
    /// Run the kinds --kinds names with this command (no shell): shard facts in SHARDCTL_*
    /// variables, payload on stdin, result on stdout.
    #[arg(long, requires = "kinds")]
    pub exec: Option<String>,
    /// Run the kinds --kinds names in long-lived worker processes of this command (no shell),
    /// up to --concurrency of them, one shard at a time each, over the line protocol of
    /// docs/handlers.md (clients/python and clients/node speak it). Instead of --exec.
    #[arg(long, conflicts_with = "exec", requires = "kinds")]
    pub worker: Option<String>,
    /// The kinds --exec or --worker runs, joined by commas (e.g. report,thumbs), or '*' for
    /// every kind that is not built in. This executor claims only these and the built-in kinds:
    /// a shard of another kind is left for an executor that serves it.
    #[arg(long, value_parser = kinds)]
    pub kinds: Option<Served>,
    /// Aggregate the kinds --kinds names (those with no built-in handler) in worker processes
    /// of this command (the same protocol: an aggregate request, the shards' outcomes line by
    /// line).
    #[arg(long, conflicts_with = "aggregate_exec")]
    pub aggregate_worker: Option<String>,
    /// Aggregate the kinds --kinds names (those --exec runs, with no built-in handler) with this command:
    /// shard outcomes as JSON lines on stdin, the task result on stdout. Built-in kinds keep
    /// their own aggregation (primes: the count; noop, sleep, fail: the summary of counts).
    #[arg(long)]
    pub aggregate_exec: Option<String>,
    /// What an --exec (or --aggregate-exec) handler's exit code means: CLASS=CODES, the class
    /// one of permanent (the shard fails for good now), retry-after (the next attempt after the
    /// {"retry_after_ms":N} it printed, else 30s; no attempt used), fail-task (the task fails at
    /// once) or retry (the backoff). Repeatable. Defaults: permanent=65 retry-after=75
    /// fail-task=78 (sysexits.h); any other non-zero code: retry.
    #[arg(long = "exit-code", value_name = "CLASS=CODES")]
    pub exit_code: Vec<String>,
    /// A --worker request with no sign of life for this long (no line from the worker on stdout
    /// or stderr, no CPU time) fails its attempt and the worker is replaced: a frozen worker, or
    /// a reply stuck in a buffer the worker did not flush. The libraries send a sign of life
    /// while a handler runs. 0s: never.
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub worker_silence: Duration,
    /// Lock time to live: a crashed executor's shards are recovered after it.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub lock_duration: Duration,
    /// Heartbeat period (default: half the lock duration).
    #[arg(long, value_parser = duration)]
    pub lock_renew: Option<Duration>,
    /// How often the full stalled sweep runs (once per interval across all processes): it finds
    /// shards whose holder has no lease at all. A dead executor's shards come back when its lease
    /// expires, whatever this interval.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub stalled_interval: Duration,
    /// Stalls a shard survives; one more fails it.
    #[arg(long, default_value_t = DEFAULT_MAX_STALLED)]
    pub max_stalled_count: u32,
    /// At shutdown, time running shards get to finish before they are released.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub grace: Duration,
    /// Longest blocking wait for work before claiming again.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub block_timeout: Duration,
    /// Membership heartbeat period (failover and rebalancing run after each).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub member_heartbeat: Duration,
    /// A node whose membership heartbeat is older than this is gone (default: 3 heartbeats).
    #[arg(long, value_parser = duration)]
    pub member_timeout: Option<Duration>,
    /// Largest result a shard may return, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTPUT)]
    pub max_result_bytes: usize,
    /// Serve Prometheus metrics on this address (GET /metrics), e.g. 0.0.0.0:9464 (default: off).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
}

pub async fn run(args: &Args, a: &ExecutorArgs) -> anyhow::Result<ExitCode> {
    let executor = ExecutorConfig {
        node_id: a.node_id.clone().unwrap_or_else(cfg::default_node_id),
        concurrency: a.concurrency,
        prefetch: a.prefetch,
        lock_duration: a.lock_duration,
        lock_renew: a.lock_renew.unwrap_or(a.lock_duration / 2),
        block_timeout: a.block_timeout,
        grace: a.grace,
        max_claim_batch: cfg::DEFAULT_MAX_CLAIM_BATCH,
        max_result_bytes: a.max_result_bytes,
        ..Default::default()
    };
    let config = NodeConfig {
        executor,
        membership: MembershipConfig {
            heartbeat: a.member_heartbeat,
            timeout: a.member_timeout.unwrap_or(a.member_heartbeat * 3),
        },
        sweep: SweepConfig { interval: a.stalled_interval, max_stalled: a.max_stalled_count },
        metrics_addr: a.metrics_addr,
    };
    if a.kinds.is_some() && a.exec.is_none() && a.worker.is_none() {
        return Err(shardctl_common::Error::invalid(
            "--kinds names the kinds --exec or --worker runs; give one of them too",
        )
        .into());
    }
    let commands = Commands {
        kinds: a.kinds.clone().unwrap_or(Served::Every),
        exec: a.exec.clone(),
        aggregate_exec: a.aggregate_exec.clone(),
        worker: a.worker.clone(),
        aggregate_worker: a.aggregate_worker.clone(),
        worker_silence: Some(a.worker_silence),
        exit_codes: ExitCodes::parse(&a.exit_code)
            .map_err(|e| shardctl_common::Error::invalid(format!("--exit-code: {e}")))?,
    };
    let registry = commands.registry(a.max_result_bytes)?;
    let endpoint = shardctl_common::conn::open(&args.redis_url()?)?;
    // refused at once while another live executor holds this node id
    let node = Node::start(endpoint, args.home()?, config, registry).await?;
    match node.run_until_signal().await {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e @ shardctl_common::Error::Refused { .. }) => Err(anyhow::anyhow!("stopped: {e}")),
        Err(e) => Err(e.into()),
    }
}

/// Parses `--kinds`.
fn kinds(s: &str) -> Result<Served, String> {
    Served::parse(s).map_err(|e| e.to_string())
}
