//! `shardctl status`.

use std::process::ExitCode;

use clap::Parser;
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
    let home = args.home()?;
    let Some(id) = &a.task else {
        let q = progress::queue(&mut con, &home, &args.queue, 10).await?;
        let nodes = progress::nodes(&mut con, &home).await?;
        let coordinators = shardctl_coordinator::presence::live(&mut con, &home).await?;
        let durability = shardctl_coordinator::confirm::status(&mut con, &home).await?;
        if a.json {
            let mut v = serde_json::to_value(&q)?;
            v["nodes"] = serde_json::to_value(&nodes)?;
            v["coordinators"] = coordinators.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>().into();
            v["durability"] = serde_json::to_value(&durability)?;
            outln!("{v}");
        } else {
            let names: Vec<String> = coordinators.into_iter().map(|(c, _)| c).collect();
            for l in shardctl::text::queue(&q, &nodes, &names) {
                outln!("{l}");
            }
            outln!("{}", shardctl::text::durability(&durability));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let t = progress::task(&mut con, &home, id).await?;
    if a.failed {
        let failed = progress::failed_shards(&mut con, &home, id).await?;
        if a.json {
            outln!("{}", shardctl::json::failed(&failed));
        } else {
            for l in shardctl::text::failed(&t, &failed) {
                outln!("{l}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    // why it may not be moving: said, never guessed (empty when nothing is known)
    let stuck: Vec<String> =
        shardctl_coordinator::stuck::reasons(&mut con, &home, &t).await?.iter().map(ToString::to_string).collect();
    // its longest running shards, as the executors' heartbeats name them
    let longest = if t.state.is_finished() {
        Vec::new()
    } else {
        progress::longest_running(&progress::nodes(&mut con, &home).await?, &t.task_id, LONGEST)
    };
    if a.json {
        let mut v = serde_json::to_value(&t)?;
        v["stuck"] = stuck.into();
        v["running_longest"] = longest
            .iter()
            .map(|(node, r)| serde_json::json!({ "shard": r.shard, "node": node, "running_ms": r.running_ms }))
            .collect();
        outln!("{v}");
    } else {
        outln!("{}", shardctl::text::task_lines(std::slice::from_ref(&t))[0]);
        if t.running.is_some() {
            let total = progress::held_total(&mut con, &home).await?;
            if let Some(l) = shardctl::text::sharing(&t, total) {
                outln!("{l}");
            }
        }
        for s in &stuck {
            outln!("waiting: {s}");
        }
        if let Some(spread) = t.spread() {
            outln!("{spread}");
        }
        if let Some(l) = shardctl::text::running_longest(&longest) {
            outln!("{l}");
        }
        for l in shardctl::text::outcome(&t) {
            outln!("{l}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The running shards `status TASK` names.
const LONGEST: usize = 5;
