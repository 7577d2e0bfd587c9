//! `shardctl results TASK`: every shard's stored outcome as JSON lines, in shard order, read a
//! page at a time (a task of millions of shards streams in bounded memory).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use shardctl_common::share;

use super::args::{connect, Args};

/// Shards read per page.
const PAGE: u64 = 1000;

#[derive(Debug, Parser)]
pub struct ResultsArgs {
    /// The task id.
    pub task: String,
}

pub async fn run(args: &Args, a: &ResultsArgs) -> anyhow::Result<ExitCode> {
    super::args::task_id(&a.task)?;
    let (_, mut con) = connect(args).await?;
    let home = args.home()?;
    let t = shardctl_coordinator::progress::task(&mut con, &home, &a.task).await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let dropped = t.state.is_finished() && !t.keep_results;
    let mut shown = 0u64;
    let mut from = 0;
    while from < t.total {
        for (i, o) in share::outcomes(&mut con, &home, &t, from, PAGE).await? {
            let Some(line) = shardctl::json::outcome(i, &o, dropped) else { continue };
            if writeln!(out, "{line}").is_err() {
                // a closed pipe (`| head`): nothing more to say
                return Ok(ExitCode::SUCCESS);
            }
            shown += 1;
        }
        from += PAGE;
    }
    let _ = out.flush();
    if let Some(note) = shardctl::text::results_note(&t, shown) {
        eprintln!("{note}");
    }
    Ok(ExitCode::SUCCESS)
}
