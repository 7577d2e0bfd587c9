//! The flags of `shardctl bench`, made into [`Options`].

use std::path::PathBuf;

use clap::ValueEnum;

use crate::scenario::{Options, Scenario};

/// The flags of `shardctl bench` (the binary flattens them into its command line).
#[derive(Debug, clap::Parser)]
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

impl BenchArgs {
    /// The options of a bench run whose executors are processes of `exe`; shards and runs of at
    /// least 1.
    pub fn options(&self, exe: PathBuf) -> shardctl_common::Result<Options> {
        if self.shards < 1 || self.runs < 1 {
            return Err(shardctl_common::Error::invalid("--shards and --runs must be at least 1"));
        }
        let mut scenarios: Vec<Scenario> =
            if self.only.is_empty() { Scenario::value_variants().to_vec() } else { self.only.clone() };
        scenarios.sort();
        scenarios.dedup();
        if self.no_bullmq {
            scenarios.retain(|&s| s != Scenario::Bullmq);
        }
        Ok(Options { shards: self.shards, runs: self.runs, scenarios, exe })
    }
}
