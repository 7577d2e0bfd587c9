//! The performance benchmark behind `shardctl bench`: the scenarios below, measured on one
//! redis-server whose database starts empty. Each scenario runs [`Options::runs`] times on a
//! freshly flushed database; the [`Report`]'s table shows medians, each against its target.
//! Progress goes to stderr as it runs. Executors run as processes of the `shardctl` program
//! named by [`Options::exe`] (the binary passes itself).
//!
//! - `e2e`: N no-op pull shards, one executor process with default flags, from dispatch to the
//!   task's `completed` state; Redis's CPU and the executor process's.
//! - `dispatch-pull`, `dispatch-routed`: dispatch alone (routed: consistent hash over 8 live
//!   members, no executor running).
//! - `primes`: primes below 2×10^8 in 2000 shards on 2 executor processes of concurrency 1 vs
//!   the same 2000 ranges counted by 2 plain threads.
//! - `small`: primes below 2×10^8 in 20,000 shards on 2 executor processes with default flags
//!   vs the same task as 1 shard on them.
//! - `idle`: 100 idle executors in this process for 10 s.
//! - `upkeep`: one executor holding 10,000 `sleep` shards, heartbeat every second.
//! - `failover`: an executor process holding 4 shards (lock 5 s, other flags default) is
//!   SIGKILLed; the time until another executor process holds them all.
//! - `pickup`: an idle executor process (default flags) blocked on the marker; dispatch of a
//!   one-shard task → its claim, from the server's `MONITOR` timestamps, 250 times.
//! - `rss`: an executor process's RSS idle and with 10,000 `sleep` shards in flight.
//! - `cluster`: a private 3-master Redis Cluster started by the bench; N no-op shards through 2
//!   executor processes on a queue of 1 partition, then of 3: throughput and each master's
//!   Redis CPU per shard (like `durability`, it does not use the bench's own server).
//! - `durability`: a private redis-server master and one replica of it (`--replicaof`), started
//!   by the bench; the `e2e` workload on the master with the queue's durability `none`, then
//!   `replica` (executors confirm each batch of completions with a pipeline ending in `WAIT 1`):
//!   both throughputs, their ratio, and the `WAIT` calls per shard (`INFO commandstats`).
//! - `bullmq`: `bench/bullmq/bench.js`, BullMQ's best case, on the same Redis.
//! - `workers`: 2,000 shards sleeping 2 ms at concurrency 8 through the built-in `sleep`, a
//!   Python `--exec` handler, Python and Node `--worker`s; 5,000 no-op shards through each.
//! - `fairness`: a 16-shard task of 50 ms shards behind a 3,200-shard one of the same priority
//!   on 2 executors of concurrency 8, against it alone.
//! - `failures`: 600 shards of which 60 fail the same way on every attempt: the time to the
//!   failed verdict with the failures retried, permanent, and with `--max-failures 10`.
//! - `stragglers`: 400 shards of 50 ms on 4 executors of concurrency 4, with one node 100×
//!   slower against none.
//!
//! Redis figures come from `INFO` before and after (CPU = user + sys; commands = the `calls` of
//! `INFO commandstats`, which counts commands run inside scripts under their own names too).

//!
//! # Layout
//! `args` ([`BenchArgs`], the command's flags); one file per scenario group (`queue`: e2e and dispatch; `holding`: idle and upkeep; `primes`,
//! `small`, `rss`, `pickup`, `failover`, `cluster`, `durability`, `bullmq`, `workers`, `fairness`, `failures`, `stragglers`), `process` (executor processes of
//! [`Options::exe`]), `stats` (Redis `INFO` figures), `table` (medians against targets),
//! [`redis_server`] (the private server of `shardctl bench` and `shardctl demo`).

mod args;
mod bullmq;
mod cluster;
mod durability;
mod failover;
mod failures;
mod fairness;
mod holding;
mod pickup;
mod primes;
mod process;
mod queue;
pub mod redis_server;
mod rss;
mod scenario;
mod small;
mod stats;
mod stragglers;
pub mod table;
mod targets;
mod workers;

use std::collections::BTreeMap;

use serde_json::json;
use shardctl_common::{conn, Home};

pub use args::BenchArgs;
use scenario::{median, Ctx};
pub use scenario::{Figures, Options, Scenario};

/// What a bench measured.
pub struct Report {
    /// Shards of the end-to-end and dispatch scenarios.
    pub shards: u64,
    /// Runs of each scenario.
    pub runs: u32,
    /// The server's version.
    pub redis_version: String,
    /// Cores of this machine.
    pub cores: usize,
    /// Every run's figures, by scenario.
    pub figures: BTreeMap<Scenario, Vec<Figures>>,
    /// The medians, by scenario.
    pub medians: BTreeMap<Scenario, Figures>,
    /// The table: each figure against its target.
    pub rows: Vec<table::Row>,
    /// What a reader of the figures should know (load, skipped or failed runs).
    pub notes: Vec<String>,
    /// Runs that failed.
    pub failed_runs: usize,
}

/// The figures that are numbers: one that could not be measured (a ratio over a zero) is left
/// out rather than written as JSON `null` where a number is promised.
fn finite(f: &Figures) -> serde_json::Map<String, serde_json::Value> {
    f.iter().filter(|(_, v)| v.is_finite()).map(|(k, v)| ((*k).to_owned(), json!(v))).collect()
}

impl Report {
    /// The whole report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let scenarios: serde_json::Map<String, serde_json::Value> = self
            .figures
            .iter()
            .map(|(s, v)| {
                let runs: Vec<_> = v.iter().map(finite).collect();
                (s.name().to_owned(), json!({ "median": finite(&self.medians[s]), "runs": runs }))
            })
            .collect();
        json!({
            "shards": self.shards,
            "runs": self.runs,
            "redis_version": self.redis_version,
            "cores": self.cores,
            "bullmq_jobs": self.shards.min(bullmq::CAP),
            "scenarios": scenarios,
            "table": self.rows,
            "notes": self.notes,
        })
    }

    /// The report as text: a heading, the table, the notes.
    pub fn render(&self) -> String {
        let mut out = format!(
            "shardctl bench: {} shards, medians of {} run(s), redis {} on {} cores\n",
            self.shards, self.runs, self.redis_version, self.cores
        );
        out.push_str(&table::render(&self.rows));
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }
}

/// Runs the bench on the redis-server at `url` with the keys of `prefix` and `queue`. `given`:
/// the server is the user's, so its database must be empty, and its latency-tracking is
/// restored after.
pub async fn run(url: &str, given: bool, prefix: &str, queue: &str, opts: &Options) -> anyhow::Result<Report> {
    if opts.shards < 1 || opts.runs < 1 {
        return Err(shardctl_common::Error::invalid("shards and runs must be at least 1").into());
    }
    let endpoint = conn::open(url)?;
    if endpoint.is_cluster() {
        // INFO, FLUSHDB and CONFIG would reach one random node of a cluster
        return Err(
            shardctl_common::Error::invalid("the bench measures one redis-server: give a single-server URL").into()
        );
    }
    let mut con = endpoint.manager().await?;
    if given && stats::dbsize(&mut con).await? > 0 {
        return Err(shardctl_common::Error::invalid(
            "the bench flushes its database between runs: point it at an empty database",
        )
        .into());
    }
    let version = stats::redis_version(&mut con).await?;
    stats::preload_scripts(&mut con).await?;
    let tracking = stats::latency_tracking_off(&mut con).await;
    let mut restore = con.clone();
    let mut ctx = Ctx {
        url: url.to_owned(),
        endpoint,
        con,
        keys: Home::new(prefix, queue)?,
        prefix: prefix.to_owned(),
        queue: queue.to_owned(),
        shards: opts.shards,
        exe: opts.exe.clone(),
    };
    let mut notes = Vec::new();
    if tracking.is_some() {
        notes.push(
            "redis latency-tracking off during the bench (its per-command histograms would count as memory)".into(),
        );
    }
    let measured = measure(opts, &mut ctx, version, notes).await;
    if let (Some(v), true) = (tracking, given) {
        if let Err(e) = stats::set_latency_tracking(&mut restore, &v).await {
            eprintln!("could not restore latency-tracking {v}: {e:#}");
        }
    }
    measured
}

async fn measure(opts: &Options, ctx: &mut Ctx, version: String, mut notes: Vec<String>) -> anyhow::Result<Report> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = stats::load_average();
    eprintln!(
        "shardctl bench: {} shards, {} run(s) each, redis {version}, {cores} cores; scenarios: {}",
        opts.shards,
        opts.runs,
        opts.scenarios.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
    );

    let mut runs: BTreeMap<Scenario, Vec<Figures>> = BTreeMap::new();
    let mut errors = 0;
    for &s in &opts.scenarios {
        let mut bullmq_script = None;
        if s == Scenario::Bullmq {
            match bullmq::prepare().await {
                Ok((p, what)) => {
                    eprintln!("{what}");
                    notes.push(what);
                    bullmq_script = Some(p);
                }
                Err(e) => {
                    notes.push(format!("bullmq skipped: {e:#}"));
                    eprintln!("bullmq skipped: {e:#}");
                    continue;
                }
            }
            if opts.shards > bullmq::CAP {
                notes.push(format!("bullmq ran {} jobs (capped), shardctl {} shards", bullmq::CAP, opts.shards));
            }
        }
        for r in 1..=opts.runs {
            stats::flush(&mut ctx.con).await?;
            stats::reset_stats(&mut ctx.con).await?;
            let started = std::time::Instant::now();
            let out = match s {
                Scenario::E2e => queue::e2e(ctx).await,
                Scenario::DispatchPull => queue::dispatch_pull(ctx).await,
                Scenario::DispatchRouted => queue::dispatch_routed(ctx).await,
                Scenario::Primes => primes::run(ctx).await,
                Scenario::Small => small::run(ctx).await,
                Scenario::Idle => holding::idle(ctx).await,
                Scenario::Upkeep => holding::upkeep(ctx).await,
                Scenario::Rss => rss::run(ctx).await,
                Scenario::Pickup => pickup::run(ctx).await,
                Scenario::Failover => failover::run(ctx).await,
                Scenario::Cluster => cluster::run(ctx).await,
                Scenario::Durability => durability::run(ctx).await,
                Scenario::Workers => workers::run(ctx).await,
                Scenario::Fairness => fairness::run(ctx).await,
                Scenario::Failures => failures::run(ctx).await,
                Scenario::Stragglers => stragglers::run(ctx).await,
                Scenario::Bullmq => {
                    let script = bullmq_script.as_deref().expect("prepared");
                    bullmq::run(ctx, script, opts.shards.min(bullmq::CAP)).await
                }
            };
            match out {
                Ok(f) => {
                    let shown: Vec<String> = f.iter().map(|(k, v)| format!("{k}={}", short(*v))).collect();
                    eprintln!(
                        "{} run {r}/{} ({:.1}s): {}",
                        s.name(),
                        opts.runs,
                        started.elapsed().as_secs_f64(),
                        shown.join(" ")
                    );
                    runs.entry(s).or_default().push(f);
                }
                Err(e) => {
                    errors += 1;
                    eprintln!("{} run {r}/{} failed: {e:#}", s.name(), opts.runs);
                    notes.push(format!("{} run {r} failed: {e:#}", s.name()));
                }
            }
        }
    }
    stats::flush(&mut ctx.con).await?;

    if let (Some(start), Some(end)) = (load, stats::load_average()) {
        // other processes on the machine disturb every figure
        notes.push(format!("1-minute load average {start} at the start, {end} at the end"));
    }
    if runs.contains_key(&Scenario::DispatchPull) {
        notes.push(
            "(*) the first task of a queue creates the queue's keys, the event stream among them \
             (Redis preallocates 4 KB for a stream's first node)"
                .into(),
        );
    }
    let medians: BTreeMap<Scenario, Figures> = runs.iter().map(|(&s, v)| (s, median_figures(v))).collect();
    let rows = table::rows(&medians);
    Ok(Report {
        shards: opts.shards,
        runs: opts.runs,
        redis_version: version,
        cores,
        figures: runs,
        medians,
        rows,
        notes,
        failed_runs: errors,
    })
}

/// A number for the progress lines.
fn short(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// Each figure's median over the runs that produced it.
fn median_figures(runs: &[Figures]) -> Figures {
    let mut all: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for f in runs {
        for (&k, &v) in f {
            all.entry(k).or_default().push(v);
        }
    }
    all.into_iter().map(|(k, v)| (k, median(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn medians_of_odd_and_even_runs() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let runs = vec![Figures::from([("a", 1.0), ("b", 5.0)]), Figures::from([("a", 3.0)])];
        let m = median_figures(&runs);
        assert_eq!(m["a"], 2.0);
        assert_eq!(m["b"], 5.0);
    }

    #[test]
    fn scenario_names_are_the_command_line_values() {
        for s in Scenario::value_variants() {
            assert_eq!(s.to_possible_value().unwrap().get_name(), s.name());
        }
    }
}
