//! `shardctl wait` (and `dispatch --wait`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_common::conn::Conn;
use shardctl_common::model::{TaskInfo, TaskState};
use shardctl_coordinator::stuck::Stuck;
use shardctl_coordinator::wait::wait_explained;

use super::args::{connect, duration, Args};
use super::{bar::Bar, exit};

#[derive(Debug, Parser)]
pub struct WaitArgs {
    /// The task id.
    pub task: String,
    /// Give up after this long (exit 1).
    #[arg(long, value_parser = duration)]
    pub timeout: Option<Duration>,
    /// Print the final status as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &WaitArgs) -> anyhow::Result<ExitCode> {
    super::args::task_id(&a.task)?;
    let (_, mut con) = connect(args).await?;
    wait_or_interrupt(&mut con, args, &a.task, a.timeout, a.json).await
}

/// [`wait_and_print`] that SIGINT or SIGTERM ends at once (exit 128 + the signal's number),
/// saying that the task goes on without the waiter, where it stands, and what to do next.
pub async fn wait_or_interrupt(
    con: &mut Conn,
    args: &Args,
    id: &str,
    timeout: Option<Duration>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| signal(kind).map_err(|e| anyhow::anyhow!("listening for signals: {e}"));
    let (mut int, mut term) = (listen(SignalKind::interrupt())?, listen(SignalKind::terminate())?);
    let (name, number) = tokio::select! {
        r = wait_and_print(con, args, id, timeout, json) => return r,
        _ = int.recv() => ("SIGINT", 2),
        _ = term.recv() => ("SIGTERM", 15),
    };
    let now = match shardctl_coordinator::progress::task(con, &args.home()?, id).await {
        Ok(t) => format!(" ({}: {} of {} shards done, {} failed)", t.state.as_str(), t.done, t.total, t.failed),
        Err(_) => String::new(),
    };
    eprintln!(
        "{name}: stopped waiting; task {id} goes on{now}: `shardctl wait {id}` waits again, \
         `shardctl cancel {id}` stops it"
    );
    Ok(ExitCode::from(exit::SIGNAL_BASE + number))
}

pub async fn wait_and_print(
    con: &mut Conn,
    args: &Args,
    id: &str,
    timeout: Option<Duration>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let bar = Bar::new();
    let on_stuck = |why: &[Stuck]| match why {
        [] => bar.note(&format!("task {id}: nothing known blocks it any more")),
        why => {
            let why: Vec<String> = why.iter().map(ToString::to_string).collect();
            bar.note(&format!("task {id} is not moving: {}", why.join("; ")));
        }
    };
    let t = wait_explained(con, &args.home()?, id, timeout, |t| bar.update(t), on_stuck).await;
    bar.finish();
    let t = t?;
    print_final(&t, json);
    if !json && t.failed > 0 {
        print_reasons(con, args, &t).await?;
    }
    Ok(final_code(&t))
}

/// Reasons read for the summary at most (a task with more failures is only pointed at them).
const SUMMARY_MAX_FAILED: u64 = 100_000;
/// Reasons shown.
const TOP_REASONS: usize = 5;

/// The most frequent failure reasons of ended task `t`, with their counts, and where to see
/// each failed shard.
async fn print_reasons(con: &mut Conn, args: &Args, t: &TaskInfo) -> anyhow::Result<()> {
    let id = &t.task_id;
    if t.failed <= SUMMARY_MAX_FAILED {
        let failed = shardctl_coordinator::progress::failed_shards(con, &args.home()?, id).await?;
        for l in shardctl::text::top_reasons(&failed, TOP_REASONS) {
            outln!("{l}");
        }
    }
    outln!("each failed shard: `shardctl status {id} --failed`");
    Ok(())
}

pub fn final_code(t: &TaskInfo) -> ExitCode {
    match t.state {
        TaskState::Completed => ExitCode::SUCCESS,
        TaskState::Cancelled => ExitCode::from(exit::TASK_CANCELLED),
        _ => ExitCode::from(exit::TASK_FAILED),
    }
}

pub fn print_final(t: &TaskInfo, json: bool) {
    if json {
        outln!("{}", serde_json::to_string(t).expect("json"));
        return;
    }
    for l in shardctl::text::ended(t) {
        outln!("{l}");
    }
}
