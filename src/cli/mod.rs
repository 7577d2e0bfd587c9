//! The argument model and the dispatch to one file per command.

/// `println!` that survives a closed stdout: see [`stdout::write_stdout`].
macro_rules! outln {
    () => {
        $crate::cli::stdout::write_stdout(format_args!(""), true)
    };
    ($($t:tt)*) => {
        $crate::cli::stdout::write_stdout(format_args!($($t)*), true)
    };
}

/// `print!` that survives a closed stdout.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::stdout::write_stdout(format_args!($($t)*), false)
    };
}

mod args;
mod bar;
mod bench;
mod config;
mod control;
mod coordinator;
mod demo;
mod dispatch;
mod executor;
pub mod exit;
mod lock;
mod pause;
mod results;
mod ring;
mod schedule;
mod status;
pub mod stdout;
mod task_args;
mod wait;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use args::Args;

/// Split one large batch task into shards and run them on many machines through Redis.
///
/// Global options come on the command line or from the environment (SHARDCTL_REDIS,
/// SHARDCTL_QUEUE, SHARDCTL_LOG, SHARDCTL_LOG_FORMAT); the command line wins.
#[derive(Debug, Parser)]
#[command(name = "shardctl", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub args: Args,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the command line, then takes each global option not given on it from its
    /// environment variable. Read by hand, not by clap's `env`: clap counts an option taken from
    /// the environment as given, and prints it in the usage line of every error.
    pub fn parse_with_env() -> Result<Cli, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().try_get_matches()?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        let args = &mut cli.args;
        let from_env = |id: &str, var: &str| -> Option<String> {
            if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                return None;
            }
            std::env::var(var).ok().filter(|v| !v.is_empty())
        };
        let bad =
            |var: &str, e: String| Cli::command().error(clap::error::ErrorKind::ValueValidation, format!("{var}: {e}"));
        // the file takes the place of SHARDCTL_REDIS
        if args.redis_url_file.is_none() {
            args.redis = args.redis.take().or_else(|| from_env("redis", "SHARDCTL_REDIS"));
        }
        if let Some(q) = from_env("queue", "SHARDCTL_QUEUE") {
            args.queue = args::queue_name(&q).map_err(|e| bad("SHARDCTL_QUEUE", e))?;
        }
        args.log = args.log.take().or_else(|| from_env("log", "SHARDCTL_LOG"));
        if let Some(f) = from_env("log_format", "SHARDCTL_LOG_FORMAT") {
            args.log_format = <args::LogFormat as clap::ValueEnum>::from_str(&f, true)
                .map_err(|_| bad("SHARDCTL_LOG_FORMAT", format!("'{f}' is not text or json")))?;
        }
        Ok(cli)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Split a task into shards and queue it; prints the task id.
    Dispatch(dispatch::DispatchArgs),
    /// Claim and run shards until SIGINT or SIGTERM.
    Executor(executor::ExecutorArgs),
    /// Run the queue's maintenance (stalled sweep, retries, re-routing) and export its progress
    /// as Prometheus metrics, until SIGINT or SIGTERM.
    Coordinator(coordinator::CoordinatorArgs),
    /// Show the queue's counts, or one task.
    Status(status::StatusArgs),
    /// Wait for a task to end; exit 0 when it completed, 3 when it failed, 4 when cancelled.
    Wait(wait::WaitArgs),
    /// Every shard's result (or failure reason) of a task, as JSON lines in shard order.
    Results(results::ResultsArgs),
    /// Run a primes task end to end on a private redis-server and check the result.
    Demo(demo::DemoArgs),
    /// Placement strategies: `ring simulate` shows balance and movement.
    Ring(ring::RingArgs),
    /// Run a command while holding a distributed lock (fencing token in SHARDCTL_FENCING_TOKEN);
    /// SIGINT/SIGTERM/SIGHUP stop the command's process group and release the lock.
    #[command(after_help = lock::EXIT_HELP)]
    Lock(lock::LockArgs),
    /// Stop claims on the queue (running shards finish).
    Pause,
    /// Restart claims on the queue.
    Resume,
    /// Cancel a task: no more claims, running shards stop, no aggregation.
    Cancel(control::TaskIdArg),
    /// Run a task's failed shards again (or its failed aggregation).
    Retry(control::TaskIdArg),
    /// Remove ended tasks past their retention, or all that ended before --older-than.
    Clean(control::CleanArgs),
    /// Show or set the queue-wide rate limit: at most --max shards start per --per.
    Limit(control::LimitArgs),
    /// Cron schedules of tasks, fired by `shardctl coordinator`: add, list, remove.
    Schedule(schedule::ScheduleArgs),
    /// Tail the queue's event log live.
    Watch(watch::WatchArgs),
    /// Show or change the queue's settings: the event log, the partitions tasks are spread over.
    Config(config::ConfigArgs),
    /// Measure throughput, Redis CPU, commands and memory per shard on a private redis-server,
    /// against the performance targets and, where Node.js is installed, BullMQ.
    Bench(shardctl_bench::BenchArgs),
}

/// Installs the log subscriber; a filter that does not parse is refused (bad usage).
pub fn init_logging(cli: &Cli) -> Result<(), String> {
    let args = &cli.args;
    let default = match cli.command {
        Command::Executor(_) | Command::Coordinator(_) => "info",
        _ => "warn",
    };
    let filter = args.log.clone().unwrap_or_else(|| default.to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).map_err(|e| {
        format!("--log (or SHARDCTL_LOG) '{filter}' is not a log filter ({e}): give error, warn, info, debug or trace")
    })?;
    use std::io::IsTerminal;
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match args.log_format {
        args::LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        args::LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    Ok(())
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let args = cli.args;
    match &cli.command {
        Command::Dispatch(a) => dispatch::run(&args, a).await,
        Command::Executor(a) => executor::run(&args, a).await,
        Command::Coordinator(a) => coordinator::run(&args, a).await,
        Command::Status(a) => status::run(&args, a).await,
        Command::Wait(a) => wait::run(&args, a).await,
        Command::Results(a) => results::run(&args, a).await,
        Command::Demo(a) => demo::run(&args, a).await,
        Command::Ring(a) => ring::run(a),
        Command::Lock(a) => lock::run(&args, a).await,
        Command::Pause => pause::run(&args, true).await,
        Command::Resume => pause::run(&args, false).await,
        Command::Cancel(a) => control::cancel(&args, a).await,
        Command::Retry(a) => control::retry(&args, a).await,
        Command::Clean(a) => control::clean(&args, a).await,
        Command::Limit(a) => control::limit(&args, a).await,
        Command::Schedule(a) => schedule::run(&args, a).await,
        Command::Watch(a) => watch::run(&args, a).await,
        Command::Config(a) => config::run(&args, a).await,
        Command::Bench(a) => bench::run(&args, a).await,
    }
}

/// The exit code of a command line clap refused: clap's own (2; 0 for --help), except for
/// `shardctl lock`, whose own failures must not look like its command's exit codes.
pub fn usage_exit_code(e: &clap::Error) -> u8 {
    use clap::CommandFactory;
    if e.use_stderr() {
        // parsed again, as far as it goes, only to learn which subcommand was meant
        let meant = Cli::command().ignore_errors(true).try_get_matches().ok();
        if meant.as_ref().and_then(|m| m.subcommand_name()) == Some("lock") {
            return exit::FAILED;
        }
    }
    e.exit_code().clamp(0, 255) as u8
}
