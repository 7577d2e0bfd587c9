//! `shardctl bench`: the figures of the performance issue, measured on a private redis-server
//! (or `--redis`, whose database must be empty). Each scenario runs `--runs` times on a freshly
//! flushed database; the table shows medians, each against its target.
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
//! - `bullmq`: `bench/bullmq/bench.js`, BullMQ's best case, on the same Redis.
//!
//! Redis figures come from `INFO` before and after (CPU = user + sys; commands = the `calls` of
//! `INFO commandstats`, which counts commands run inside scripts under their own names too).

mod bullmq;
mod failover;
mod holding;
mod pickup;
mod primes;
mod process;
mod queue;
mod rss;
mod small;
mod stats;
mod table;

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Parser, ValueEnum};
use serde_json::json;
use shardctl_common::conn::Conn;
use shardctl_common::{conn, Keys};
use tokio_util::sync::CancellationToken;

use super::{redis_server::RedisServer, Args};

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
    pub runs: usize,
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
    /// BullMQ's best case on the same Redis.
    Bullmq,
}

impl Scenario {
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
            Scenario::Bullmq => "bullmq",
        }
    }
}

/// The named figures of one run of one scenario.
pub(crate) type Figures = BTreeMap<&'static str, f64>;

/// What every scenario works with.
pub(crate) struct Ctx {
    pub url: String,
    pub endpoint: shardctl_common::conn::Endpoint,
    pub con: Conn,
    pub prefix: String,
    pub queue: String,
    pub keys: Keys,
    pub shards: u64,
}

pub async fn run(args: &Args, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    if a.shards < 1 || a.runs < 1 {
        return Err(shardctl_common::Error::invalid("--shards and --runs must be at least 1").into());
    }
    let mut selected: Vec<Scenario> =
        if a.only.is_empty() { Scenario::value_variants().to_vec() } else { a.only.clone() };
    selected.sort();
    selected.dedup();
    if a.no_bullmq {
        selected.retain(|&s| s != Scenario::Bullmq);
    }
    let interrupted = CancellationToken::new();
    shardctl_executor::shutdown::cancel_on_signal(interrupted.clone());
    let given = args.given_redis()?;
    let (_server, url) = RedisServer::unless_given(&given)?;
    tokio::select! {
        r = bench(args, a, &selected, url) => r,
        _ = interrupted.cancelled() => bail!("interrupted"),
    }
}

async fn bench(args: &Args, a: &BenchArgs, selected: &[Scenario], url: String) -> anyhow::Result<ExitCode> {
    let given = args.given_redis()?;
    let endpoint = conn::open(&url)?;
    if endpoint.is_cluster() {
        // INFO, FLUSHDB and CONFIG would reach one random node of a cluster
        return Err(
            shardctl_common::Error::invalid("the bench measures one redis-server: give a single-server URL").into()
        );
    }
    let mut con = endpoint.manager().await?;
    if given.is_some() && stats::dbsize(&mut con).await? > 0 {
        return Err(shardctl_common::Error::invalid(
            "the bench flushes its database between runs: point --redis at an empty database",
        )
        .into());
    }
    let version = stats::redis_version(&mut con).await?;
    stats::preload_scripts(&mut con).await?;
    let tracking = stats::latency_tracking_off(&mut con).await;
    let mut restore = con.clone();
    let queue = args.queue.clone();
    let mut ctx = Ctx {
        url: url.clone(),
        endpoint,
        con,
        keys: Keys::new(&args.prefix, &queue)?,
        prefix: args.prefix.clone(),
        queue,
        shards: a.shards,
    };
    let mut notes = Vec::new();
    if tracking.is_some() {
        notes.push(
            "redis latency-tracking off during the bench (its per-command histograms would count as memory)".into(),
        );
    }
    let measured = measure(a, selected, &mut ctx, &version, notes).await;
    if let (Some(v), true) = (tracking, given.is_some()) {
        if let Err(e) = stats::set_latency_tracking(&mut restore, &v).await {
            eprintln!("could not restore latency-tracking {v}: {e:#}");
        }
    }
    measured
}

async fn measure(
    a: &BenchArgs,
    selected: &[Scenario],
    ctx: &mut Ctx,
    version: &str,
    mut notes: Vec<String>,
) -> anyhow::Result<ExitCode> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = stats::load_average();
    eprintln!(
        "shardctl bench: {} shards, {} run(s) each, redis {version}, {cores} cores; scenarios: {}",
        a.shards,
        a.runs,
        selected.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
    );

    let mut runs: BTreeMap<Scenario, Vec<Figures>> = BTreeMap::new();
    let mut errors = 0;
    for &s in selected {
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
            if a.shards > bullmq::CAP {
                notes.push(format!("bullmq ran {} jobs (capped), shardctl {} shards", bullmq::CAP, a.shards));
            }
        }
        for r in 1..=a.runs {
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
                Scenario::Bullmq => {
                    let script = bullmq_script.as_deref().expect("prepared");
                    bullmq::run(ctx, script, a.shards.min(bullmq::CAP)).await
                }
            };
            match out {
                Ok(f) => {
                    let shown: Vec<String> = f.iter().map(|(k, v)| format!("{k}={}", short(*v))).collect();
                    eprintln!(
                        "{} run {r}/{} ({:.1}s): {}",
                        s.name(),
                        a.runs,
                        started.elapsed().as_secs_f64(),
                        shown.join(" ")
                    );
                    runs.entry(s).or_default().push(f);
                }
                Err(e) => {
                    errors += 1;
                    eprintln!("{} run {r}/{} failed: {e:#}", s.name(), a.runs);
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
    if a.json {
        let scenarios: serde_json::Map<String, serde_json::Value> =
            runs.iter().map(|(s, v)| (s.name().to_owned(), json!({ "median": medians[s], "runs": v }))).collect();
        let out = json!({
            "shards": a.shards,
            "runs": a.runs,
            "redis_version": version,
            "cores": cores,
            "bullmq_jobs": a.shards.min(bullmq::CAP),
            "scenarios": scenarios,
            "table": rows,
            "notes": notes,
        });
        outln!("{out}");
    } else {
        outln!("shardctl bench: {} shards, medians of {} run(s), redis {version} on {cores} cores", a.shards, a.runs);
        out!("{}", table::render(&rows));
        for n in &notes {
            outln!("note: {n}");
        }
    }
    Ok(if errors > 0 { ExitCode::from(super::exit::ERROR) } else { ExitCode::SUCCESS })
}

/// A number for the progress lines.
fn short(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
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
