//! `shardctl status`.

use std::process::ExitCode;

use clap::Parser;
use shardctl_common::model::TaskInfo;
use shardctl_coordinator::progress;

use super::args::{connect, Args};

#[derive(Debug, Parser)]
pub struct StatusArgs {
    /// A task id; without it, the queue's counts.
    pub task: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// With a task: list its failed shards and their reasons.
    #[arg(long, requires = "task")]
    pub failed: bool,
}

pub async fn run(args: &Args, a: &StatusArgs) -> anyhow::Result<ExitCode> {
    if let Some(id) = &a.task {
        super::args::task_id(id)?;
    }
    let (_, mut con) = connect(args).await?;
    let keys = args.keys()?;
    let Some(id) = &a.task else {
        let q = progress::queue(&mut con, &keys, &args.queue, 10).await?;
        let nodes = progress::nodes(&mut con, &keys).await?;
        let coordinators = shardctl_coordinator::presence::live(&mut con, &keys).await?;
        if a.json {
            let mut v = serde_json::to_value(&q)?;
            v["nodes"] = serde_json::to_value(&nodes)?;
            v["coordinators"] = coordinators.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>().into();
            outln!("{v}");
        } else {
            outln!(
                "queue {}{}: {} waiting, {} active, {} delayed",
                q.queue,
                if q.paused { " (paused)" } else { "" },
                q.waiting,
                q.active,
                q.delayed
            );
            let mut states: Vec<_> = q.tasks.iter().collect();
            states.sort();
            let states: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
            outln!("tasks: {}", if states.is_empty() { "none".into() } else { states.join(", ") });
            for l in lines(&q.recent) {
                outln!("  {l}");
            }
            outln!("executors: {}", if nodes.is_empty() { "none live" } else { "" });
            for n in &nodes {
                let num = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
                outln!(
                    "  {} ({} pid {}, concurrency {}, kinds {}): {} active, {} routed waiting, heartbeat {} ms ago",
                    n.node,
                    n.host,
                    num(n.pid),
                    num(n.concurrency),
                    if n.kinds.is_empty() { "?" } else { &n.kinds },
                    n.active,
                    n.waiting,
                    n.heartbeat_age_ms
                );
            }
            if coordinators.is_empty() {
                outln!("coordinators: none live (schedules do not fire without one)");
            } else {
                let names: Vec<&str> = coordinators.iter().map(|(c, _)| c.as_str()).collect();
                outln!("coordinators: {}", names.join(", "));
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let t = progress::task(&mut con, &keys, id).await?;
    if a.failed {
        let failed = progress::failed_shards(&mut con, &keys, id).await?;
        if a.json {
            let v: Vec<_> = failed.iter().map(|(i, r)| serde_json::json!({ "shard": i, "reason": r })).collect();
            outln!("{}", serde_json::Value::Array(v));
        } else {
            if failed.is_empty() {
                outln!("task {id}: no failed shards");
            }
            for (i, r) in failed {
                outln!("shard {i}: {r}");
            }
            // the aggregation is no shard, but a failure of it is the task's
            if let Some(e) = &t.aggregation_error {
                outln!("aggregation failed: {e}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    // why it may not be moving: said, never guessed (empty when nothing is known)
    let stuck: Vec<String> =
        shardctl_coordinator::stuck::reasons(&mut con, &keys, &t).await?.iter().map(ToString::to_string).collect();
    if a.json {
        let mut v = serde_json::to_value(&t)?;
        v["stuck"] = stuck.into();
        outln!("{v}");
    } else {
        outln!("{}", lines(std::slice::from_ref(&t))[0]);
        for s in &stuck {
            outln!("waiting: {s}");
        }
        if let Some(spread) = t.spread() {
            outln!("{spread}");
        }
        if let Some(r) = &t.result {
            outln!("result: {r}");
        }
        if let Some(e) = &t.aggregation_error {
            outln!("aggregation failed: {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per task, its columns as wide as the longest id and kind among them: a bar, counts,
/// rate and ETA (from the average rate since dispatch; after a `retry`, the time since it and no
/// rate, the counts holding what ran before it).
fn lines(tasks: &[TaskInfo]) -> Vec<String> {
    let id_w = tasks.iter().map(|t| t.task_id.chars().count()).max().unwrap_or(0);
    let kind_w = tasks.iter().map(|t| t.kind.chars().count()).max().unwrap_or(0);
    tasks.iter().map(|t| line(t, id_w, kind_w)).collect()
}

fn line(t: &TaskInfo, id_w: usize, kind_w: usize) -> String {
    const WIDTH: usize = 24;
    let finished = t.done + t.failed;
    let frac = if t.total == 0 { 1.0 } else { finished as f64 / t.total as f64 };
    let filled = ((frac * WIDTH as f64).round() as usize).min(WIDTH);
    let bar = format!("{}{}", "#".repeat(filled), "-".repeat(WIDTH - filled));
    let end = t.finished_ms.unwrap_or_else(shardctl_common::time::now_ms);
    let secs = end.saturating_sub(t.retried_ms.unwrap_or(t.created_ms)) as f64 / 1000.0;
    let rate = if secs > 0.0 && t.retried_ms.is_none() { finished as f64 / secs } else { 0.0 };
    let now = shardctl_common::time::now_ms();
    // a delayed task: when it starts
    let starts_in = t.start_ms.filter(|&s| s > now && !t.state.is_finished()).map(|s| s - now);
    let eta = match (t.state.is_finished(), t.retried_ms) {
        (false, None) if starts_in.is_some() => {
            format!("starts in {}", human_secs(starts_in.unwrap_or(0) as f64 / 1000.0))
        }
        (true, None) => format!("took {}", human_secs(secs)),
        (true, Some(_)) => format!("took {} since the retry", human_secs(secs)),
        (false, Some(_)) => format!("retried {} ago", human_secs(secs)),
        (false, None) if rate > 0.0 => format!("eta {}", human_secs((t.total - finished) as f64 / rate)),
        (false, None) => "eta ?".to_owned(),
    };
    let rate = if t.retried_ms.is_none() && starts_in.is_none() { format!(" {rate:.0}/s") } else { String::new() };
    format!(
        "{:<id_w$}  {:<kind_w$}  {:<11} [{bar}] {:>5.1}% {}/{} ({} failed){rate} {eta}",
        t.task_id,
        t.kind,
        t.state.as_str(),
        frac * 100.0,
        finished,
        t.total,
        t.failed,
    )
}

fn human_secs(s: f64) -> String {
    match s {
        s if s < 60.0 => format!("{s:.1}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s => format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
    }
}
