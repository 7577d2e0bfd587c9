//! `shardctl schedule add | list | remove`: cron schedules of tasks, fired by `shardctl
//! coordinator` processes (each fire time's task created once however many run).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shardctl_common::names;
use shardctl_common::schedule::{self, Misfire, Overlap, Schedule, DEFAULT_MISFIRE_GRACE};
use shardctl_common::time::{now_ms, server_now_ms};
use shardctl_common::Error;

use super::args::{connect, duration, Args};
use super::task_args::TaskArgs;

#[derive(Debug, Parser)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Add a schedule: a task (dispatch options) created at each fire time of a cron expression.
    Add(Box<AddArgs>),
    /// List the schedules with their last and next fire times.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (its tasks stay).
    Remove {
        /// The schedule's name.
        name: String,
    },
}

#[derive(Debug, Parser)]
pub struct AddArgs {
    /// The schedule's name (1-40 of A-Z a-z 0-9 . _ -); its tasks are `<name>-<UTC fire time>`.
    pub name: String,
    /// Cron expression: `min hour day month weekday`, or with seconds first; @daily, @hourly ...
    #[arg(long)]
    pub cron: String,
    /// IANA time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// While the previous task of the schedule is unfinished: skip a fire time, or allow it.
    #[arg(long, default_value = "skip", value_parser = |s: &str| s.parse::<Overlap>())]
    pub overlap: Overlap,
    /// Fire times missed while no coordinator ran: skip them, or run the latest once.
    #[arg(long, default_value = "skip", value_parser = |s: &str| s.parse::<Misfire>())]
    pub misfire: Misfire,
    /// A fire time handled later than this counts as missed.
    #[arg(long, value_parser = duration)]
    pub misfire_grace: Option<Duration>,
    /// Replace a schedule of the same name.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub task: TaskArgs,
    /// Options of `dispatch` a schedule cannot take: accepted here only to say why.
    #[command(flatten)]
    pub not_here: DispatchOnly,
}

/// `dispatch` options that have no meaning for a schedule (hidden): given, they are refused with
/// the reason, where clap would only say "unexpected argument".
#[derive(Debug, Parser)]
pub struct DispatchOnly {
    #[arg(long, hide = true)]
    task_id: Option<String>,
    #[arg(long, hide = true)]
    wait: bool,
    #[arg(long, hide = true)]
    delay: Option<String>,
}

impl DispatchOnly {
    fn check(&self, name: &str) -> Result<(), Error> {
        let example = format!("{name}-20261201T030000Z");
        if self.task_id.is_some() {
            return Err(Error::invalid(format!(
                "a schedule takes no --task-id: it names each task it creates <NAME>-<UTC fire time> \
                 (e.g. {example})"
            )));
        }
        if self.wait {
            return Err(Error::invalid(format!(
                "a schedule takes no --wait: its tasks start at their fire times; wait for one with \
                 `shardctl wait {example}`"
            )));
        }
        if self.delay.is_some() {
            return Err(Error::invalid("a schedule takes no --delay: its tasks start at their fire times"));
        }
        Ok(())
    }
}

pub async fn run(args: &Args, a: &ScheduleArgs) -> anyhow::Result<ExitCode> {
    match &a.command {
        ScheduleCommand::Add(add) => run_add(args, add).await,
        ScheduleCommand::List { json } => run_list(args, *json).await,
        ScheduleCommand::Remove { name } => {
            names::validate_schedule_name(name)?;
            let (_, mut con) = connect(args).await?;
            if !schedule::remove(&mut con, &args.home()?, name).await? {
                // like a missing task: an error (1), not bad usage
                anyhow::bail!("no schedule named '{name}'");
            }
            outln!("schedule {name} removed");
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn run_add(args: &Args, a: &AddArgs) -> anyhow::Result<ExitCode> {
    // the schedule's own parts first: their messages say more than a missing --shards
    names::validate_schedule_name(&a.name)?;
    a.not_here.check(&a.name)?;
    a.cron.parse::<shardctl_common::cron::Cron>()?;
    shardctl_common::cron::zone(&a.tz)?;
    let shards = a.task.shards.ok_or_else(|| Error::invalid("--shards N is required"))?;
    let spec = a.task.spec(String::new(), shards)?;
    let grace = a.misfire_grace.unwrap_or(DEFAULT_MISFIRE_GRACE);
    // checked before connecting: a bad expression or zone is reported as such even without Redis
    Schedule::new(&a.name, &a.cron, &a.tz, a.overlap, a.misfire, grace, &spec, now_ms())?;
    let (_, mut con) = connect(args).await?;
    // created at the server's time: fire times are judged by that clock (docs/design/clock.md)
    let now = server_now_ms(&mut con, args.home()?.keys()).await?;
    let s = Schedule::new(&a.name, &a.cron, &a.tz, a.overlap, a.misfire, grace, &spec, now)?;
    schedule::add(&mut con, &args.home()?, &s, a.replace).await?;
    let next = s.next_after(now).map_or_else(|| "never".to_owned(), |t| shardctl_common::cron::show(t, &s.tz));
    outln!("schedule {} added: '{}' in {}; next fire {next}", s.name, s.cron, s.tz);
    if shardctl_coordinator::presence::live(&mut con, &args.home()?).await?.is_empty() {
        eprintln!(
            "note: no coordinator is running for queue '{}': schedules fire only while `shardctl coordinator` runs",
            args.queue
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_list(args: &Args, json: bool) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let now = server_now_ms(&mut con, args.home()?.keys()).await?;
    let all = schedule::list(&mut con, &args.home()?, now).await?;
    if json {
        let v: Vec<serde_json::Value> = all.iter().map(|(s, st)| shardctl::json::schedule(s, st)).collect();
        outln!("{}", serde_json::Value::Array(v));
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        outln!("no schedules");
    }
    for (s, st) in &all {
        outln!("{}", shardctl::text::schedule(s, st));
    }
    Ok(ExitCode::SUCCESS)
}
