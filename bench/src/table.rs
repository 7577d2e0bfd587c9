//! The printed table: each figure's median against its target (the issue's), with a verdict.

use std::collections::BTreeMap;

use serde::Serialize;

use super::scenario::{Figures, Scenario};

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The scenario's name.
    pub scenario: &'static str,
    /// What the figure is.
    pub figure: &'static str,
    /// The median, formatted with its unit.
    pub value: String,
    /// The median.
    pub number: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The target, as text (`-` when none).
    pub target: String,
    /// `met`, or by how much it is short.
    pub verdict: String,
    /// None when the figure has no target.
    pub met: Option<bool>,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    None,
    /// At most the limit; the second number is the aim.
    AtMost(f64, Option<f64>),
    /// At least the limit; the second number is the aim.
    AtLeast(f64, Option<f64>),
}

use Target::{AtLeast, AtMost};

struct Spec {
    scenario: Scenario,
    key: &'static str,
    figure: &'static str,
    unit: &'static str,
    decimals: usize,
    target: Target,
}

const fn spec(
    scenario: Scenario,
    key: &'static str,
    figure: &'static str,
    unit: &'static str,
    decimals: usize,
    target: Target,
) -> Spec {
    Spec { scenario, key, figure, unit, decimals, target }
}

const SPECS: &[Spec] = &[
    spec(Scenario::E2e, "shards_per_s", "throughput, dispatch to completed", "shards/s", 0, Target::None),
    spec(Scenario::E2e, "secs", "wall time", "s", 2, Target::None),
    spec(Scenario::E2e, "cpu_us_per_shard", "Redis CPU per shard", "µs", 2, AtMost(2.5, None)),
    spec(Scenario::E2e, "executor_cpu_us_per_shard", "executor process CPU per shard", "µs", 2, AtMost(2.0, None)),
    spec(Scenario::E2e, "executor_cores", "executor process CPU", "cores", 2, Target::None),
    spec(Scenario::E2e, "script_calls_per_shard", "EVALSHA calls per shard", "", 4, Target::None),
    spec(Scenario::E2e, "commands_per_shard", "Redis commands per shard (in scripts too)", "", 2, Target::None),
    spec(Scenario::E2e, "bytes_per_shard", "Redis bytes per shard after dispatch", "B", 4, Target::None),
    spec(Scenario::E2e, "peak_bytes_per_shard", "Redis bytes per shard, peak (sampled)", "B", 2, Target::None),
    spec(Scenario::E2e, "map_ms", "dashboard shard map of the task, read and made", "ms", 1, AtMost(1000.0, None)),
    spec(Scenario::E2e, "map_bytes", "dashboard shard map of the task, JSON sent", "B", 0, Target::None),
    spec(Scenario::DispatchPull, "ms", "dispatch time", "ms", 2, AtMost(50.0, None)),
    spec(Scenario::DispatchPull, "bytes", "Redis memory added by a task", "B", 0, AtMost(1024.0, None)),
    spec(Scenario::DispatchPull, "fresh_ms", "dispatch time, fresh queue", "ms", 2, AtMost(50.0, None)),
    spec(Scenario::DispatchPull, "fresh_bytes", "Redis memory added, fresh queue (*)", "B", 0, Target::None),
    spec(Scenario::DispatchRouted, "secs", "dispatch time, 8 live executors", "s", 2, AtMost(3.0, None)),
    spec(Scenario::DispatchRouted, "bytes_per_shard", "Redis bytes per waiting shard", "B", 1, AtMost(40.0, None)),
    spec(Scenario::DispatchRouted, "script_calls", "script calls", "", 0, Target::None),
    spec(Scenario::Primes, "executors_secs", "2 executor processes, --concurrency 1", "s", 2, Target::None),
    spec(Scenario::Primes, "plain_secs", "plain program, 2 threads", "s", 2, Target::None),
    spec(Scenario::Primes, "ratio_pct", "executors' speed vs the plain program", "%", 1, AtLeast(90.0, None)),
    spec(Scenario::Primes, "prefetch_secs", "the same with --prefetch 0 (no claim-ahead)", "s", 2, Target::None),
    spec(Scenario::Primes, "prefetch_ratio_pct", "speed vs the plain program, --prefetch 0", "%", 1, Target::None),
    spec(Scenario::Primes, "work_us_per_shard", "work per shard (plain program)", "µs", 0, Target::None),
    spec(Scenario::Primes, "overhead_us_per_shard", "executors' time per shard on top of it", "µs", 0, Target::None),
    spec(Scenario::Primes, "prefetch_overhead_us_per_shard", "the same with --prefetch 0", "µs", 0, Target::None),
    spec(Scenario::Primes, "cpu_us_per_shard", "Redis CPU per shard", "µs", 1, Target::None),
    spec(Scenario::Primes, "bound_pct", "bound: plain ÷ (plain + Redis CPU ÷ 2 cores)", "%", 1, Target::None),
    spec(Scenario::Primes, "script_calls_per_shard", "EVALSHA calls per shard", "", 2, Target::None),
    spec(Scenario::Small, "sharded_secs", "20,000 shards, 2 executor processes, default flags", "s", 2, Target::None),
    spec(Scenario::Small, "one_shard_secs", "the same task in 1 shard", "s", 2, Target::None),
    spec(Scenario::Small, "ratio_pct", "speed vs the same task in 1 shard", "%", 1, AtLeast(80.0, Some(90.0))),
    spec(Scenario::Small, "work_us_per_shard", "work per shard (1-shard time ÷ 20,000)", "µs", 1, Target::None),
    spec(Scenario::Small, "cpu_us_per_shard", "Redis CPU per shard", "µs", 2, Target::None),
    spec(Scenario::Small, "script_calls_per_shard", "EVALSHA calls per shard", "", 3, Target::None),
    spec(Scenario::Idle, "bzpopmin_per_block", "BZPOPMIN per executor per block timeout", "", 2, AtMost(1.0, None)),
    spec(Scenario::Idle, "sent_per_block", "commands sent per executor per block timeout", "", 2, Target::None),
    spec(Scenario::Idle, "commands_per_block", "Redis commands (in scripts too) per ditto", "", 2, Target::None),
    spec(Scenario::Idle, "cpu_pct", "Redis CPU, 100 idle executors", "% of a core", 3, AtMost(1.0, None)),
    spec(Scenario::Upkeep, "claim_secs", "claim 10,000 sleep shards", "s", 2, Target::None),
    spec(Scenario::Upkeep, "scripts_per_beat", "script calls per heartbeat", "", 2, AtMost(1.0, None)),
    spec(Scenario::Upkeep, "commands_per_beat", "Redis commands per heartbeat", "", 2, Target::None),
    spec(Scenario::Upkeep, "held", "shards still held after 5 heartbeats", "", 0, AtLeast(10_000.0, None)),
    spec(Scenario::Upkeep, "locks_lost", "locks lost", "", 0, AtMost(0.0, None)),
    spec(Scenario::Upkeep, "marked", "shards a sweep marks stalled", "", 0, AtMost(0.0, None)),
    spec(Scenario::Upkeep, "released", "released at shutdown", "", 0, AtLeast(10_000.0, None)),
    // the issue fixes no memory target: the figures are shown for the record
    spec(Scenario::Rss, "idle_mib", "executor process RSS, idle", "MiB", 1, Target::None),
    spec(Scenario::Rss, "in_flight_mib", "executor RSS, 10,000 sleep shards in flight", "MiB", 1, Target::None),
    spec(Scenario::Rss, "bytes_per_shard_in_flight", "RSS per in-flight shard", "B", 0, Target::None),
    spec(Scenario::Pickup, "p50_ms", "dispatch → claim, idle executor, median", "ms", 3, Target::None),
    spec(Scenario::Pickup, "p99_ms", "dispatch → claim, 99th percentile", "ms", 3, AtMost(1.0, None)),
    spec(Scenario::Pickup, "max_ms", "dispatch → claim, slowest", "ms", 3, Target::None),
    spec(Scenario::Pickup, "samples", "samples (server MONITOR timestamps)", "", 0, Target::None),
    spec(Scenario::Failover, "secs", "kill -9 → shards held elsewhere, lock 5 s", "s", 1, AtMost(6.0, None)),
    spec(Scenario::Cluster, "k1_shards_per_s", "3 masters, 1 partition: throughput", "shards/s", 0, Target::None),
    spec(
        Scenario::Cluster,
        "k1_cpu_us_per_shard",
        "1 partition: Redis CPU per shard, all masters",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k1_master1_cpu_us_per_shard",
        "1 partition: master 1's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k1_master2_cpu_us_per_shard",
        "1 partition: master 2's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k1_master3_cpu_us_per_shard",
        "1 partition: master 3's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k1_max_master_share",
        "1 partition: busiest master's share of Redis CPU",
        "",
        2,
        Target::None,
    ),
    spec(Scenario::Cluster, "k3_shards_per_s", "3 masters, 3 partitions: throughput", "shards/s", 0, Target::None),
    spec(
        Scenario::Cluster,
        "k3_cpu_us_per_shard",
        "3 partitions: Redis CPU per shard, all masters",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k3_master1_cpu_us_per_shard",
        "3 partitions: master 1's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k3_master2_cpu_us_per_shard",
        "3 partitions: master 2's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k3_master3_cpu_us_per_shard",
        "3 partitions: master 3's CPU per shard",
        "µs",
        2,
        Target::None,
    ),
    spec(
        Scenario::Cluster,
        "k3_max_master_share",
        "3 partitions: busiest master's share of Redis CPU",
        "",
        2,
        AtMost(0.40, None),
    ),
    spec(
        Scenario::Cluster,
        "k3_vs_k1_throughput",
        "throughput of 3 partitions ÷ 1 partition",
        "",
        2,
        AtLeast(1.0, None),
    ),
    spec(Scenario::Bullmq, "jobs", "jobs", "", 0, Target::None),
    spec(Scenario::Bullmq, "add_rate", "bulk add (addBulk of 1000)", "jobs/s", 0, Target::None),
    spec(Scenario::Bullmq, "process_rate", "processing, 1 worker × 200", "jobs/s", 0, Target::None),
    spec(Scenario::Bullmq, "cpu_us_per_job", "Redis CPU per job (add + process)", "µs", 2, Target::None),
    spec(Scenario::Bullmq, "commands_per_job", "Redis commands per job (add + process)", "", 2, Target::None),
    spec(Scenario::Bullmq, "script_calls_per_job", "EVALSHA calls per job", "", 3, Target::None),
    spec(Scenario::Bullmq, "bytes_per_job", "Redis bytes per waiting job", "B", 0, Target::None),
    spec(Scenario::Workers, "builtin_per_s", "2 ms shards, built-in sleep, concurrency 8", "shards/s", 0, Target::None),
    spec(
        Scenario::Workers,
        "exec_py_per_s",
        "the same, --exec python3 (a process per shard)",
        "shards/s",
        0,
        Target::None,
    ),
    spec(
        Scenario::Workers,
        "worker_py_per_s",
        "the same, --worker python3 (clients/python)",
        "shards/s",
        0,
        Target::None,
    ),
    spec(Scenario::Workers, "worker_node_per_s", "the same, --worker node (clients/node)", "shards/s", 0, Target::None),
    spec(Scenario::Workers, "worker_py_pct", "Python worker vs built-in", "%", 1, AtLeast(80.0, None)),
    spec(Scenario::Workers, "worker_node_pct", "Node worker vs built-in", "%", 1, AtLeast(80.0, None)),
    spec(Scenario::Workers, "exec_py_pct", "Python --exec vs built-in", "%", 1, Target::None),
    spec(Scenario::Workers, "builtin_cpu_us", "executor CPU per shard, built-in", "µs", 1, Target::None),
    spec(Scenario::Workers, "worker_py_cpu_us", "executor CPU per shard, Python worker", "µs", 1, Target::None),
    spec(Scenario::Workers, "worker_node_cpu_us", "executor CPU per shard, Node worker", "µs", 1, Target::None),
    spec(Scenario::Workers, "worker_cpu_ratio", "executor CPU per shard, worker ÷ built-in", "×", 2, AtMost(2.0, None)),
    spec(Scenario::Workers, "noop_per_s", "no-op shards, built-in noop", "shards/s", 0, Target::None),
    spec(Scenario::Workers, "noop_py_per_s", "no-op shards, Python worker", "shards/s", 0, Target::None),
    spec(Scenario::Workers, "noop_node_per_s", "no-op shards, Node worker", "shards/s", 0, Target::None),
    spec(Scenario::Workers, "noop_py_us", "time a Python worker adds to a shard", "µs", 0, Target::None),
    spec(Scenario::Workers, "noop_node_us", "time a Node worker adds to a shard", "µs", 0, Target::None),
];

/// The rows for the medians, then the comparison with BullMQ where both sides ran.
pub(crate) fn rows(medians: &BTreeMap<Scenario, Figures>) -> Vec<Row> {
    let mut out = Vec::new();
    for s in SPECS {
        if let Some(&v) = medians.get(&s.scenario).and_then(|f| f.get(s.key)) {
            out.push(row(s.scenario.name(), s.figure, v, s.unit, s.decimals, s.target));
        }
    }
    let get = |s: Scenario, k: &str| medians.get(&s).and_then(|f| f.get(k)).copied();
    let (e2e, bull) = (Scenario::E2e, Scenario::Bullmq);
    if let (Some(ours), Some(theirs)) = (get(e2e, "shards_per_s"), get(bull, "process_rate")) {
        let r = ours / theirs;
        out.push(row("compare", "e2e shards/s ÷ BullMQ jobs/s", r, "×", 1, AtLeast(10.0, None)));
    }
    if let (Some(ours), Some(theirs)) = (get(e2e, "cpu_us_per_shard"), get(bull, "cpu_us_per_job")) {
        out.push(row("compare", "BullMQ Redis CPU ÷ ours, per item", theirs / ours, "×", 1, Target::None));
    }
    if let (Some(ours), Some(theirs)) = (get(e2e, "commands_per_shard"), get(bull, "commands_per_job")) {
        out.push(row("compare", "BullMQ Redis commands ÷ ours, per item", theirs / ours, "×", 1, Target::None));
    }
    if let (Some(ours), Some(theirs)) = (get(Scenario::DispatchRouted, "bytes_per_shard"), get(bull, "bytes_per_job")) {
        out.push(row("compare", "BullMQ bytes per waiting job ÷ routed shard", theirs / ours, "×", 1, Target::None));
    }
    // a ratio over a zero is no figure
    out.retain(|r| r.number.is_finite());
    out
}

fn row(scenario: &'static str, figure: &'static str, v: f64, unit: &'static str, decimals: usize, t: Target) -> Row {
    let with_unit = |x: f64| {
        let n = number(x, decimals);
        match unit {
            "" => n,
            "×" | "%" => format!("{n}{unit}"),
            u => format!("{n} {u}"),
        }
    };
    let short = |missing: f64, limit: f64| {
        if limit == 0.0 {
            format!("short by {}", with_unit(missing))
        } else {
            format!("short by {} ({:.0}%)", with_unit(missing), missing / limit.abs() * 100.0)
        }
    };
    let (target, verdict, met) = match t {
        Target::None => ("-".to_owned(), String::new(), None),
        AtMost(limit, aim) => {
            let met = v <= limit;
            let mut verdict = if met { "met".to_owned() } else { short(v - limit, limit) };
            let mut target = format!("≤ {}", with_unit(limit));
            if let Some(aim) = aim {
                target.push_str(&format!(" (aim {})", number(aim, decimals)));
                if met && v > aim {
                    verdict.push_str(&format!("; aim {}", short(v - aim, aim)));
                }
            }
            (target, verdict, Some(met))
        }
        AtLeast(limit, aim) => {
            let met = v >= limit;
            let mut verdict = if met { "met".to_owned() } else { short(limit - v, limit) };
            let mut target = format!("≥ {}", with_unit(limit));
            if let Some(aim) = aim {
                target.push_str(&format!(" (aim {})", number(aim, decimals)));
                if met && v < aim {
                    verdict.push_str(&format!("; aim {}", short(aim - v, aim)));
                }
            }
            (target, verdict, Some(met))
        }
    };
    Row { scenario, figure, value: with_unit(v), number: v, unit, target, verdict, met }
}

/// `decimals` places; whole numbers of five digits or more get thousands separators.
fn number(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    if decimals > 0 || x.abs() < 10_000.0 {
        return s;
    }
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// The table as text, columns padded.
pub(crate) fn render(rows: &[Row]) -> String {
    let header = ["scenario", "figure", "value", "target", "verdict"];
    let cells: Vec<[&str; 5]> =
        rows.iter().map(|r| [r.scenario, r.figure, r.value.as_str(), r.target.as_str(), r.verdict.as_str()]).collect();
    let mut width = header.map(|h| h.chars().count());
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: [&str; 5]| {
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(width).enumerate() {
            let pad = w - cell.chars().count();
            // numbers right-aligned
            if i == 2 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                if i < 4 {
                    s.push_str(&" ".repeat(pad));
                }
            }
            if i < 4 {
                s.push_str("  ");
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    out.push_str(&line(width.map(|w| "-".repeat(w)).each_ref().map(String::as_str)));
    let mut last = "";
    for (r, c) in rows.iter().zip(&cells) {
        let mut c = *c;
        if r.scenario == last {
            c[0] = "";
        }
        last = r.scenario;
        out.push_str(&line(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_say_by_how_much() {
        let r = row("e2e", "cpu", 3.0, "µs", 2, AtMost(5.0, Some(2.5)));
        assert_eq!(r.verdict, "met; aim short by 0.50 µs (20%)");
        assert_eq!(r.target, "≤ 5.00 µs (aim 2.50)");
        let r = row("primes", "ratio", 81.0, "%", 1, AtLeast(90.0, None));
        assert_eq!(r.verdict, "short by 9.0% (10%)");
        assert_eq!(r.met, Some(false));
        let r = row("upkeep", "lost", 0.0, "", 0, AtMost(0.0, None));
        assert_eq!(r.verdict, "met");
        assert_eq!(number(1234567.0, 0), "1,234,567");
        assert_eq!(number(999.0, 0), "999");
    }

    #[test]
    fn rows_follow_the_medians_and_compare_when_both_ran() {
        let mut m = BTreeMap::new();
        m.insert(Scenario::E2e, Figures::from([("shards_per_s", 300_000.0), ("cpu_us_per_shard", 2.0)]));
        m.insert(Scenario::Bullmq, Figures::from([("process_rate", 30_000.0), ("cpu_us_per_job", 26.0)]));
        let rows = rows(&m);
        let cmp = rows.iter().find(|r| r.figure.starts_with("e2e shards/s")).unwrap();
        assert_eq!(cmp.value, "10.0×");
        assert_eq!(cmp.verdict, "met");
        assert!(render(&rows).lines().count() >= rows.len() + 2);
    }
}
