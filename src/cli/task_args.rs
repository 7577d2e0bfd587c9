//! The options that describe a task, shared by `dispatch` and `schedule add`.

use std::time::Duration;

use clap::{ArgAction, Args as ClapArgs};
use shardctl_common::backoff::Backoff;
use shardctl_common::failure::Threshold;
use shardctl_common::model::{TaskSpec, DEFAULT_ATTEMPTS};
use shardctl_common::ring::{Strategy, DEFAULT_VNODES};
use shardctl_common::Error;

use super::args::duration;

#[derive(Debug, Clone, ClapArgs)]
pub struct TaskArgs {
    /// Number of shards (dispatch --keys-file: the number of keys; if given it must match).
    #[arg(long)]
    pub shards: Option<u64>,
    /// Number of items split over the shards (default: the number of shards).
    #[arg(long)]
    pub items: Option<u64>,
    /// Which handler runs the shards: primes, noop, sleep, fail, or one of yours (--exec).
    #[arg(long, default_value = "primes")]
    pub kind: String,
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
    /// Its share of the run slots beside other tasks of its priority (and group), in
    /// proportion to their weights (1 to 1000).
    #[arg(long, default_value_t = 1)]
    pub weight: u32,
    /// The group (a tenant, a team) it shares with: fairness is first between groups, then
    /// between the tasks of a group (default: a group of its own).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// At most N of its shards run at once across the cluster (default: no cap).
    #[arg(long, value_name = "N")]
    pub max_running: Option<u64>,
    /// Fail fast: once more than N (or N% of its) shards have failed for good, the task fails
    /// at once, its running shards stopped, without aggregation (default: no limit; 0: the
    /// first failure fails it). `retry` runs the failed and the stopped shards again.
    #[arg(long, value_name = "N|N%", value_parser = |s: &str| s.parse::<Threshold>())]
    pub max_failures: Option<Threshold>,
    /// k-of-n: once N (or N% of its) shards completed, its other shards are cancelled (stopped
    /// where they run) and it aggregates over those that ended; it ends completed (default:
    /// every shard runs).
    #[arg(long, value_name = "N|N%", value_parser = |s: &str| s.parse::<Threshold>())]
    pub success_when: Option<Threshold>,
    /// Backup attempts for stragglers: once every shard was handed out, a shard running longer
    /// than 1.5 × the task's median shard time (at least 500 ms) gets a second attempt on another
    /// node; the first to finish counts, the other is stopped. At most N (or N% of its) shards
    /// get one (default 10%). For idempotent handlers (docs/design/speculation.md).
    #[arg(long, value_name = "N|N%", num_args = 0..=1, default_missing_value = "10%",
          value_parser = |s: &str| s.parse::<Threshold>())]
    pub speculate: Option<Threshold>,
    /// Placement: pull (competitive, the default), consistent-hash, round-robin or hash-mod.
    #[arg(long, default_value = "pull", value_parser = |s: &str| s.parse::<Strategy>())]
    pub strategy: Strategy,
    /// Virtual nodes per executor on the consistent-hash ring.
    #[arg(long, default_value_t = DEFAULT_VNODES)]
    pub vnodes: u32,
    /// Keep each shard's result once the aggregation ran (false: keep only the aggregate).
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub keep_results: bool,
    /// How long the task's keys stay after it ends, or `forever` (until `shardctl clean`).
    #[arg(long, default_value = "7d", value_parser = retention, value_name = "D|forever")]
    pub retain: Retention,
}

/// A task's retention: `None` keeps it until cleaned.
#[derive(Debug, Clone, Copy)]
pub struct Retention(pub Option<Duration>);

fn retention(s: &str) -> Result<Retention, String> {
    if s == "forever" {
        return Ok(Retention(None));
    }
    duration(s).map(|d| Retention(Some(d))).map_err(|e| format!("{e}, or 'forever'"))
}

impl TaskArgs {
    /// The spec of task `id` with `shards` shards (validated by the caller).
    pub fn spec(&self, id: String, shards: u64) -> anyhow::Result<TaskSpec> {
        let payload = self.payload()?;
        // a built-in kind's payload is checked before anything is written
        shardctl_executor::builtin::check_payload(&self.kind, &payload).map_err(Error::invalid)?;
        Ok(TaskSpec {
            id,
            kind: self.kind.clone(),
            shards,
            items: self.items.unwrap_or(shards),
            payload,
            attempts: self.attempts,
            backoff: self.backoff,
            priority: self.priority,
            weight: self.weight,
            group: self.group.clone(),
            max_running: self.max_running,
            max_failures: self.max_failures,
            success_when: self.success_when,
            speculate: self.speculate,
            strategy: self.strategy,
            vnodes: self.vnodes,
            has_keys: false,
            shard_timeout: self.shard_timeout,
            delay: None,
            keep_results: self.keep_results,
            retain: self.retain.0,
        })
    }

    /// The payload from `--payload` or `--payload-file`.
    fn payload(&self) -> anyhow::Result<String> {
        match &self.payload_file {
            Some(path) => Ok(shardctl_coordinator::dispatch::read_payload_file(path)?),
            None => Ok(self.payload.clone()),
        }
    }
}
