//! The plain-text shapes of the CLI's outputs, for a program that shows a task or a queue the
//! way `shardctl` does: a task's progress line, a queue's summary, an ended task, its most
//! frequent failure reasons, an event of the log, a schedule, a queue's settings, and what the
//! commands say beside them.

use std::collections::HashMap;

use shardctl_common::control::QueueSettings;
use shardctl_common::model::{TaskInfo, TaskSpec};
use shardctl_common::partition::Layout;
use shardctl_common::ring::Strategy;
use shardctl_common::schedule::{Schedule, ScheduleState};
use shardctl_common::time::now_ms;
use shardctl_coordinator::dispatch::Dispatched;
use shardctl_coordinator::progress::{NodeStatus, QueueCounts};

use crate::units::{human_ms, human_secs, rate as rate_of};

/// One line per task, its columns as wide as the longest id and kind among them: a bar, counts,
/// rate and ETA (from the average rate since dispatch; after a `retry`, the time since it and no
/// rate, the counts holding what ran before it).
pub fn task_lines(tasks: &[TaskInfo]) -> Vec<String> {
    let id_w = tasks.iter().map(|t| t.task_id.chars().count()).max().unwrap_or(0);
    let kind_w = tasks.iter().map(|t| t.kind.chars().count()).max().unwrap_or(0);
    tasks.iter().map(|t| task_line(t, id_w, kind_w)).collect()
}

fn task_line(t: &TaskInfo, id_w: usize, kind_w: usize) -> String {
    const WIDTH: usize = 24;
    let finished = t.done + t.failed + t.cancelled.unwrap_or(0);
    let frac = if t.total == 0 { 1.0 } else { finished as f64 / t.total as f64 };
    let filled = ((frac * WIDTH as f64).round() as usize).min(WIDTH);
    let bar = format!("{}{}", "#".repeat(filled), "-".repeat(WIDTH - filled));
    let now = now_ms();
    let secs = t.finished_ms.unwrap_or(now).saturating_sub(t.retried_ms.unwrap_or(t.created_ms)) as f64 / 1000.0;
    let rate = if secs > 0.0 && t.retried_ms.is_none() { finished as f64 / secs } else { 0.0 };
    // a delayed task: when it starts
    let starts_in = t.start_ms.filter(|&s| s > now && !t.state.is_finished()).map(|s| s - now);
    let eta = match (t.state.is_finished(), t.retried_ms, starts_in) {
        (false, None, Some(s)) => format!("starts in {}", human_secs(s as f64 / 1000.0)),
        (true, None, _) => format!("took {}", human_secs(secs)),
        (true, Some(_), _) => format!("took {} since the retry", human_secs(secs)),
        (false, Some(_), _) => format!("retried {} ago", human_secs(secs)),
        (false, None, None) if rate > 0.0 => format!("eta {}", human_secs((t.total - finished) as f64 / rate)),
        (false, None, None) => "eta ?".to_owned(),
    };
    let rate =
        if t.retried_ms.is_none() && starts_in.is_none() { format!(" {}", rate_of(rate)) } else { String::new() };
    // k-of-n: the shards cancelled once it met its `--success-when`
    let cancelled = t.cancelled.map_or(String::new(), |n| format!(", {n} cancelled"));
    format!(
        "{:<id_w$}  {:<kind_w$}  {:<11} [{bar}] {:>5.1}% {finished}/{} ({} failed{cancelled}){rate} {eta}",
        t.task_id,
        t.kind,
        t.state.as_str(),
        frac * 100.0,
        t.total,
        t.failed,
    )
}

/// How a running task shares the executors (docs/design/fairness.md): the shards it holds
/// against the queue's `total`, its weight, group and cap; `None` when it holds nothing known.
pub fn sharing(t: &TaskInfo, total: u64) -> Option<String> {
    let running = t.running?;
    let pct = if total > 0 { format!(" ({:.0}%)", running as f64 * 100.0 / total as f64) } else { String::new() };
    let mut s = format!("sharing: {running} of the {total} shards running in the queue{pct}, weight {}", t.weight);
    if let Some(g) = &t.group {
        s.push_str(&format!(", group {g}"));
    }
    if let Some(c) = t.max_running {
        s.push_str(&format!(", max-running {c}"));
    }
    Some(s)
}

/// A queue's summary: its counts, its tasks by state and the recent ones, its live executors
/// and coordinators.
pub fn queue(q: &QueueCounts, nodes: &[NodeStatus], coordinators: &[String]) -> Vec<String> {
    let paused = if q.paused { " (paused)" } else { "" };
    let mut out =
        vec![format!("queue {}{paused}: {} waiting, {} active, {} delayed", q.queue, q.waiting, q.active, q.delayed)];
    let mut states: Vec<_> = q.tasks.iter().collect();
    states.sort();
    let states: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    out.push(format!("tasks: {}", if states.is_empty() { "none".into() } else { states.join(", ") }));
    out.extend(task_lines(&q.recent).into_iter().map(|l| format!("  {l}")));
    out.push(format!("executors: {}", if nodes.is_empty() { "none live" } else { "" }));
    let num = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    for n in nodes {
        out.push(format!(
            "  {} ({} pid {}, concurrency {}, kinds {}): {} active, {} routed waiting, heartbeat {} ms ago",
            n.node,
            n.host,
            num(n.pid),
            num(n.concurrency),
            if n.kinds.is_empty() { "?" } else { &n.kinds },
            n.active,
            n.waiting,
            n.heartbeat_age_ms
        ));
    }
    out.push(match coordinators {
        [] => "coordinators: none live (schedules do not fire without one)".to_owned(),
        names => format!("coordinators: {}", names.join(", ")),
    });
    out
}

/// An ended task: its state, counts and time, then its result or its aggregation's failure.
pub fn ended(t: &TaskInfo) -> Vec<String> {
    let took = |from: u64| t.finished_ms.unwrap_or(from).saturating_sub(from) as f64 / 1000.0;
    let time = match t.retried_ms {
        Some(r) => format!("in {:.2}s since the retry ({:.2}s since dispatch)", took(r), took(t.created_ms)),
        None => format!("in {:.2}s", took(t.created_ms)),
    };
    let (id, state) = (&t.task_id, t.state.as_str());
    let cancelled = t
        .cancelled
        .map_or(String::new(), |n| format!(", {n} cancelled (--success-when {} met)", t.success_when.unwrap_or(0)));
    let mut out = vec![format!(
        "task {id} {state}: {} of {} shards done, {} failed{cancelled}, {time}",
        t.done, t.total, t.failed
    )];
    out.extend(outcome(t));
    out
}

/// Why a task failed early (docs/design/failure-policies.md), its backups for stragglers
/// (docs/design/speculation.md), its result, or its aggregation's failure (none while none is
/// known).
pub fn outcome(t: &TaskInfo) -> Vec<String> {
    let result = t.result.as_ref().map(|r| format!("result: {r}"));
    let agg = t.aggregation_error.as_ref().map(|e| format!("aggregation failed: {e}"));
    t.halted.clone().into_iter().chain(speculation(t)).chain(durations(t)).chain(result).chain(agg).collect()
}

/// Its longest running shards, each with its node and how long it has run.
pub fn running_longest(running: &[(String, shardctl_coordinator::progress::RunningShard)]) -> Option<String> {
    let shown: Vec<String> =
        running.iter().map(|(node, r)| format!("shard {} on {node} ({})", r.shard, human_ms(r.running_ms))).collect();
    (!shown.is_empty()).then(|| format!("running longest: {}", shown.join(", ")))
}

/// Its shards' run times, once one was timed (docs/design/dashboard.md, "Where time goes").
pub fn durations(t: &TaskInfo) -> Option<String> {
    let d = t.durations.as_ref()?;
    Some(format!(
        "shard times ({} timed): p50 {}, p90 {}, p99 {}, max {}",
        d.count,
        human_ms(d.p50_ms),
        human_ms(d.p90_ms),
        human_ms(d.p99_ms),
        human_ms(d.max_ms)
    ))
}

/// A task with `--speculate`: its backups so far and when a shard gets one.
pub fn speculation(t: &TaskInfo) -> Option<String> {
    let cap = t.speculate?;
    Some(format!(
        "speculation: {} backup(s) of at most {cap}, {} won; a shard gets one once every shard was handed out \
         and it has run 1.5 × the median shard time (at least 500 ms)",
        t.spec_started, t.spec_won
    ))
}

/// The `top` most frequent causes among failed shards (index, reason), with their counts, most
/// frequent first: reasons are grouped by their summary's shape (a traceback's message and
/// frame, numbers and ids folded: `shardctl_common::reason`), each shown by its first shard's
/// summary.
pub fn top_reasons(failed: &[(u64, String)], top: usize) -> Vec<String> {
    use shardctl_common::reason::{shape, summary};
    // shape -> (count, first shard, its summary)
    let mut by_cause: HashMap<String, (u64, u64, String)> = HashMap::new();
    for (i, why) in failed {
        let s = summary(why);
        let e = by_cause.entry(shape(&s)).or_insert((0, *i, s.clone()));
        e.0 += 1;
        if *i < e.1 {
            (e.1, e.2) = (*i, s);
        }
    }
    let mut ranked: Vec<(u64, u64, String)> = by_cause.into_values().collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let more = if ranked.len() > top { format!(" (the {top} most frequent)") } else { String::new() };
    let mut out = vec![format!("failures by reason{more}:")];
    for (n, first, why) in ranked.into_iter().take(top) {
        let eg = if n > 1 { format!(" (first: shard {first})") } else { format!(" (shard {first})") };
        out.push(format!("  {n:>7} × {why}{eg}"));
    }
    out
}

/// An event of the log: its time (UTC, to the millisecond), its name, then its fields.
pub fn event(id: &str, fields: &[(String, String)]) -> String {
    let ms: u64 = id.split('-').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    let t = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    let event = fields.iter().find(|(k, _)| k == "event").map_or("?", |(_, v)| v.as_str());
    let rest: Vec<String> = fields.iter().filter(|(k, _)| k != "event").map(|(k, v)| format!("{k}={v}")).collect();
    format!("{t} {event:<18} {}", rest.join(" "))
}

/// A schedule with its last and next fire times, in its zone.
pub fn schedule(s: &Schedule, st: &ScheduleState) -> String {
    let field = |f: &str| s.fields.iter().find(|(k, _)| k == f).map_or("?", |(_, v)| v.as_str());
    let show = |t: u64| shardctl_common::cron::show(t, &s.tz);
    format!(
        "{}  '{}' {}  {} × {} shards  overlap {}, misfire {}  next {}  last {} ({})",
        s.name,
        s.cron,
        s.tz,
        field("kind"),
        field("total"),
        s.overlap.as_str(),
        s.misfire.as_str(),
        st.next_fire_ms.map_or_else(|| "never".to_owned(), show),
        st.last_fire_ms.map_or_else(|| "-".to_owned(), show),
        st.last_task.as_deref().unwrap_or("no task"),
    )
}

/// A queue's settings (`shardctl config`): the event log, paused, its partitions (and on a
/// cluster the master of each).
pub fn settings(queue: &str, s: &QueueSettings, layout: &Layout, masters: Option<&[String]>) -> Vec<String> {
    let tags: Vec<&str> = layout.partitions.iter().map(|p| p.tag()).collect();
    let mut out = vec![
        format!("queue {queue}"),
        format!("events_maxlen      {}{}", s.events_maxlen, if s.events_maxlen == 0 { " (events off)" } else { "" }),
        format!("events_completions {}", if s.events_completions { "on" } else { "off" }),
        format!("paused             {}", s.paused),
        format!(
            "durability         {}{}",
            s.durability.mode.as_str(),
            if s.durability.waits() { format!(" (wait at most {:?})", s.durability.timeout) } else { String::new() }
        ),
        format!(
            "partitions         {}{}",
            layout.count(),
            if tags.is_empty() { String::new() } else { format!(" ({})", tags.join(" ")) }
        ),
    ];
    out.extend(masters.map(|m| format!("partition masters  {}", m.join(" "))));
    for (name, g) in &s.groups {
        let cap = g.max_running.map_or("no cap".to_owned(), |n| format!("max-running {n}"));
        out.push(format!("group {name}: weight {}, {cap}", g.weight));
    }
    out
}

/// The queue's durability line of `status`.
pub fn durability(d: &shardctl_coordinator::confirm::Status) -> String {
    if d.mode == "none" {
        return format!(
            "durability: {} (a master's failover may lose its last writes; see docs/operations.md)",
            d.mode
        );
    }
    let how = format!("durability: {} (each wait at most {} ms)", d.mode, d.timeout_ms);
    let slot = d.unsynced_slot.as_deref().unwrap_or("?");
    match (&d.error, d.in_sync, d.unsynced_for_ms) {
        (Some(e), _, _) => format!("{how}: could not check the replicas: {e}"),
        (_, Some(true), _) => format!("{how}: in sync"),
        (_, _, Some(ms)) => format!(
            "{how}: no replica in sync for {} s (slot {slot}); nothing waiting for one acts meanwhile",
            ms / 1000
        ),
        _ => format!("{how}: no replica in sync now (slot {slot}: none acknowledged a probe)"),
    }
}

/// What `watch` says on stderr of what is to come (`None`: nothing to say): the log is off,
/// empty, or `kept` older events are left out. `kept`: the log's length, if it could be read.
pub fn watch_note(queue: &str, settings: &QueueSettings, kept: Option<u64>, from_start: bool) -> Option<String> {
    if settings.events_maxlen == 0 {
        return Some(format!(
            "note: the event log of queue {queue} is off (`shardctl config --events-maxlen N` turns it on): \
             nothing comes until then"
        ));
    }
    if from_start {
        return (kept == Some(0)).then(|| format!("note: the event log of queue {queue} is empty; waiting for events"));
    }
    let older = match kept {
        Some(0) => "none yet".to_owned(),
        Some(1) => "1 older one kept: --from-start shows it".to_owned(),
        Some(n) => format!("{n} older ones kept: --from-start shows them"),
        None => "--from-start shows the older ones".to_owned(),
    };
    Some(format!("note: showing the events of queue {queue} as they come ({older})"))
}

/// Where a routed task's shards went at dispatch (`None` for a pull task).
pub fn placed(d: &Dispatched, spec: &TaskSpec) -> Option<String> {
    if spec.strategy == Strategy::Pull {
        return None;
    }
    let how = if d.resumed { "resumed: " } else { "" };
    Some(if d.live == 0 {
        format!("{how}no live executor: the shards wait unplaced until the first one joins")
    } else {
        format!("{how}{} of {} shards placed on {} executors ({})", d.placed, spec.shards, d.live, spec.strategy)
    })
}

/// What `retry` of task `id` did: `retried` jobs queued again; `before`, the task as it was.
pub fn retried(id: &str, retried: u64, before: &TaskInfo) -> String {
    match retried {
        0 => format!("task {id} has no failed shards: nothing to retry"),
        // only an ended task with no failed shard retries its aggregation alone (a running
        // task's failures may be counted after `before` was read)
        n if before.state.is_finished() && before.failed == 0 => {
            format!("task {id}: its aggregation runs again ({n} job)")
        }
        n if before.halted.is_some() => format!(
            "task {id}: {n} failed and stopped shards queued again, the shards never started follow; \
             aggregation follows when all are done"
        ),
        n => format!("task {id}: {n} failed shards queued again; aggregation follows when all are done"),
    }
}

/// A task's failed shards with their reasons (`status --failed`), each reason's summary (a
/// traceback's message and frame), and its aggregation's failure.
pub fn failed(t: &TaskInfo, failed: &[(u64, String)]) -> Vec<String> {
    let mut out: Vec<String> =
        failed.iter().map(|(i, r)| format!("shard {i}: {}", shardctl_common::reason::summary(r))).collect();
    if failed.is_empty() {
        out.push(format!("task {}: no failed shards", t.task_id));
    } else if failed.iter().any(|(_, r)| r.trim().contains('\n')) {
        out.push("(each reason's summary: --json shows them whole, tracebacks included)".to_owned());
    }
    // the aggregation is no shard, but a failure of it is the task's
    out.extend(t.aggregation_error.as_ref().map(|e| format!("aggregation failed: {e}")));
    out
}

/// Why `results` showed `shown` outcomes of task `t`'s shards, when that is not all of them.
pub fn results_note(t: &TaskInfo, shown: u64) -> Option<String> {
    if shown >= t.total {
        return None;
    }
    let why = if !t.state.is_finished() {
        format!("task {} is {}: the others have no outcome yet", t.task_id, t.state.as_str())
    } else if !t.keep_results {
        "the task was dispatched with --keep-results false: its results were dropped at its end, its failures \
         are shown"
            .to_owned()
    } else {
        "the others have no stored outcome".to_owned()
    };
    Some(format!("note: {shown} of {} shards have an outcome; {why}", t.total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_counted_most_frequent_first() {
        let failed: Vec<(u64, String)> =
            [(0, "b"), (1, "a\nline two"), (2, "a\nline two"), (3, "c")].map(|(i, r)| (i, r.to_owned())).into();
        let lines = top_reasons(&failed, 2);
        assert_eq!(lines[0], "failures by reason (the 2 most frequent):");
        assert_eq!(lines[1], "        2 × a (first: shard 1)");
        assert_eq!(lines[2], "        1 × b (shard 0)");
        assert_eq!(lines.len(), 3);
        // one cause, a row number each, and a traceback: one group, its message and frame shown
        let tb = |row: u64| {
            format!("Traceback (most recent call last):\n  File \"/app/r.py\", line 9, in handle\nValueError: bad date in row {row}")
        };
        let failed: Vec<(u64, String)> = (0..60).map(|i| (i * 10 + 3, tb(i * 100))).collect();
        let lines = top_reasons(&failed, 5);
        assert_eq!(
            lines,
            ["failures by reason:", "       60 × ValueError: bad date in row 0 (at r.py:9 in handle) (first: shard 3)"]
        );
    }
}
