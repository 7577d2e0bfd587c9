//! `shardctl watch`: tails the queue's event log live (best effort: capped, never counted from).

use std::process::ExitCode;

use clap::Parser;
use shardctl_coordinator::events::Follow;

use super::args::{connect, Args};

#[derive(Debug, Parser)]
pub struct WatchArgs {
    /// Only this task's events.
    #[arg(long)]
    pub task: Option<String>,
    /// Start with the events already in the log (default: only new ones).
    #[arg(long)]
    pub from_start: bool,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// Print each event as a JSON line.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &WatchArgs) -> anyhow::Result<ExitCode> {
    if let Some(t) = &a.task {
        super::args::task_id(t)?;
    }
    let (endpoint, mut plain) = connect(args).await?;
    let home = args.home()?;
    // what is to come, on stderr (stdout holds only events): an empty or disabled log waits
    // silently otherwise
    let settings = shardctl_common::control::queue_settings(&mut plain, &home, None, None).await?;
    // best effort: the minimal ACL of docs/operations.md has no XLEN
    let kept: Option<u64> = redis::cmd("XLEN").arg(home.events()).query_async(&mut plain).await.ok();
    if let Some(note) = shardctl::text::watch_note(&args.queue, &settings, kept, a.from_start) {
        eprintln!("{note}");
    }
    // a blocking read needs a connection of its own with a response timeout past the block
    let blocking = endpoint.blocking(std::time::Duration::from_secs(5)).await?;
    let mut follow = Follow::start(&home, plain, blocking, a.from_start).await?;
    let mut seen = 0u64;
    loop {
        for (id, fields) in follow.next().await? {
            let get = |f: &str| fields.iter().find(|(k, _)| k == f).map(|(_, v)| v.as_str());
            if a.task.as_deref().is_some_and(|t| get("task") != Some(t)) {
                continue;
            }
            print_event(&id, &fields, a.json);
            seen += 1;
            if a.count.is_some_and(|c| seen >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
}

fn print_event(id: &str, fields: &[(String, String)], json: bool) {
    if json {
        outln!("{}", shardctl::json::event(id, fields));
    } else {
        outln!("{}", shardctl::text::event(id, fields));
    }
}
