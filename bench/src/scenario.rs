//! What a bench run is made of: its [`Options`], its [`Scenario`]s, the context each scenario
//! runs in and the [`Figures`] it returns.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::ValueEnum;
use shardctl_common::conn::Conn;
use shardctl_common::Home;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Shards of the end-to-end and dispatch scenarios (BullMQ gets at most 200,000 jobs).
    pub shards: u64,
    /// Runs of each scenario; the table shows the medians.
    pub runs: u32,
    /// The scenarios, in table order.
    pub scenarios: Vec<Scenario>,
    /// The `shardctl` program the bench starts as executor processes.
    pub exe: PathBuf,
}

/// One scenario of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Scenario {
    /// End-to-end no-op throughput, one executor.
    E2e,
    /// Pull dispatch: O(1).
    DispatchPull,
    /// Consistent-hash dispatch over 8 live executors.
    DispatchRouted,
    /// Real work: coordination overhead against a plain program.
    Primes,
    /// Small shards, default flags: 20,000 shards vs 1 shard.
    Small,
    /// 100 idle executors.
    Idle,
    /// One executor holding 10,000 shards.
    Upkeep,
    /// Executor process RSS, idle and with 10,000 shards in flight.
    Rss,
    /// Dispatch → claim latency of an idle executor.
    Pickup,
    /// A SIGKILLed executor's shards held elsewhere.
    Failover,
    /// A private 3-master cluster: 1 partition against 3.
    Cluster,
    /// A private master and replica: durability `none` against `replica` (`WAIT 1`).
    Durability,
    /// BullMQ's best case on the same Redis.
    Bullmq,
    /// Handlers in Python and Node: `--worker` and `--exec` against a built-in kind.
    Workers,
    /// A small task behind a big one of the same priority, against it alone.
    Fairness,
    /// Time to a failed verdict: failures retried, permanent, and with `--max-failures`.
    Failures,
    /// 400 shards on 4 executors, one of them 100× slower, against none slower, with and without
    /// backup attempts.
    Stragglers,
}

impl Scenario {
    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::E2e => "e2e",
            Scenario::DispatchPull => "dispatch-pull",
            Scenario::DispatchRouted => "dispatch-routed",
            Scenario::Primes => "primes",
            Scenario::Small => "small",
            Scenario::Idle => "idle",
            Scenario::Upkeep => "upkeep",
            Scenario::Rss => "rss",
            Scenario::Pickup => "pickup",
            Scenario::Failover => "failover",
            Scenario::Cluster => "cluster",
            Scenario::Durability => "durability",
            Scenario::Bullmq => "bullmq",
            Scenario::Workers => "workers",
            Scenario::Fairness => "fairness",
            Scenario::Failures => "failures",
            Scenario::Stragglers => "stragglers",
        }
    }
}

/// The named figures of one run of one scenario.
pub type Figures = BTreeMap<&'static str, f64>;

/// The median of `v` (not empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What every scenario works with.
pub(crate) struct Ctx {
    pub url: String,
    pub endpoint: shardctl_common::conn::Endpoint,
    pub con: Conn,
    pub prefix: String,
    pub queue: String,
    pub keys: Home,
    pub shards: u64,
    /// The `shardctl` program started as executor processes ([`Options::exe`]).
    pub exe: PathBuf,
}
