//! The argument model and the dispatch to one file per command.

/// `println!` that survives a closed stdout: see [`write_stdout`].
macro_rules! outln {
    () => {
        $crate::cli::write_stdout(format_args!(""), true)
    };
    ($($t:tt)*) => {
        $crate::cli::write_stdout(format_args!($($t)*), true)
    };
}

/// `print!` that survives a closed stdout.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::cli::write_stdout(format_args!($($t)*), false)
    };
}

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
mod redis_server;
mod results;
mod ring;
mod schedule;
mod status;
mod task_args;
mod wait;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shardctl_common::Home;

/// Split one large batch task into shards and run them on many machines through Redis.
///
/// Global options come on the command line or from the environment (SHARDCTL_REDIS,
/// SHARDCTL_QUEUE, SHARDCTL_LOG, SHARDCTL_LOG_FORMAT); the command line wins.
#[derive(Debug, Parser)]
#[command(name = "shardctl", version, about, propagate_version = true)]
pub struct Args {
    /// Redis URL: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS, or a cluster
    /// `redis+cluster://[user:password@]host:port,host:port` (`rediss+cluster://` for TLS).
    /// Default: SHARDCTL_REDIS, else redis://127.0.0.1:6379.
    #[arg(long, global = true, value_name = "URL", help_heading = GLOBAL)]
    pub redis: Option<String>,
    /// Read the Redis URL from this file (its first line), so a password stays out of the
    /// process list; takes the place of `--redis` (and of SHARDCTL_REDIS).
    #[arg(long, global = true, value_name = "FILE", help_heading = GLOBAL)]
    pub redis_url_file: Option<std::path::PathBuf>,
    /// Queue name: executors serve one queue. Default: SHARDCTL_QUEUE, else `default`.
    #[arg(long, global = true, value_name = "NAME", default_value = "default", hide_default_value = true,
          value_parser = queue_name, help_heading = GLOBAL)]
    pub queue: String,
    /// Prefix of every Redis key.
    #[arg(long, global = true, default_value = "shardctl", value_parser = key_prefix, help_heading = GLOBAL)]
    pub prefix: String,
    /// Log filter (error, warn, info, debug, or per module); logs go to stderr. Default:
    /// SHARDCTL_LOG, else info for executor and coordinator, warn for the rest.
    #[arg(long, global = true, value_name = "FILTER", help_heading = GLOBAL)]
    pub log: Option<String>,
    /// Log lines as text, or as one JSON object per line (`json`: time, level, message and
    /// each field under its name, for a log shipper). Default: SHARDCTL_LOG_FORMAT, else text.
    #[arg(long, global = true, value_enum, default_value = "text", hide_default_value = true,
          help_heading = GLOBAL)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// The heading of the options every command takes.
const GLOBAL: &str = "Global options";

impl Args {
    /// Parses the command line, then takes each global option not given on it from its
    /// environment variable. Read by hand, not by clap's `env`: clap counts an option taken from
    /// the environment as given, and prints it in the usage line of every error.
    pub fn parse_with_env() -> Result<Args, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Args::command().try_get_matches()?;
        let mut args = Args::from_arg_matches(&matches)?;
        let from_env = |id: &str, var: &str| -> Option<String> {
            if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                return None;
            }
            std::env::var(var).ok().filter(|v| !v.is_empty())
        };
        let bad = |var: &str, e: String| {
            Args::command().error(clap::error::ErrorKind::ValueValidation, format!("{var}: {e}"))
        };
        // the file takes the place of SHARDCTL_REDIS
        if args.redis_url_file.is_none() {
            args.redis = args.redis.take().or_else(|| from_env("redis", "SHARDCTL_REDIS"));
        }
        if let Some(q) = from_env("queue", "SHARDCTL_QUEUE") {
            args.queue = queue_name(&q).map_err(|e| bad("SHARDCTL_QUEUE", e))?;
        }
        args.log = args.log.take().or_else(|| from_env("log", "SHARDCTL_LOG"));
        if let Some(f) = from_env("log_format", "SHARDCTL_LOG_FORMAT") {
            args.log_format = <LogFormat as clap::ValueEnum>::from_str(&f, true)
                .map_err(|_| bad("SHARDCTL_LOG_FORMAT", format!("'{f}' is not text or json")))?;
        }
        Ok(args)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL message field=value …`, coloured on a terminal.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (`message` and each field).
    Json,
}

/// The default Redis URL.
pub const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

impl Args {
    /// The Redis URL given by `--redis` or `--redis-url-file`, if any. An unreadable or empty
    /// file is bad usage (exit 2); the error names the file, never its content.
    pub(crate) fn given_redis(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.redis_url_file else { return Ok(self.redis.clone()) };
        // the file overrides SHARDCTL_REDIS (not taken then), but both on the command line is
        // a mistake
        if self.redis.is_some() {
            return Err(shardctl_common::Error::invalid("give --redis or --redis-url-file, not both").into());
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            shardctl_common::Error::invalid(format!("cannot read --redis-url-file {}: {e}", path.display()))
        })?;
        match text.lines().next().map(str::trim).filter(|l| !l.is_empty()) {
            Some(url) => Ok(Some(url.to_owned())),
            None => Err(shardctl_common::Error::invalid(format!(
                "--redis-url-file {} holds no URL on its first line",
                path.display()
            ))
            .into()),
        }
    }
    fn redis_url(&self) -> anyhow::Result<String> {
        Ok(self.given_redis()?.unwrap_or_else(|| DEFAULT_REDIS.to_owned()))
    }
    /// The queue's keys; clap has checked both names already, `Keys::new` checks them again.
    fn keys(&self) -> anyhow::Result<Home> {
        Ok(Home::new(&self.prefix, &self.queue)?)
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
    Bench(bench::BenchArgs),
}

fn queue_name(s: &str) -> Result<String, String> {
    shardctl_common::names::validate_queue(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

fn key_prefix(s: &str) -> Result<String, String> {
    shardctl_common::names::validate_prefix(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// Parses durations such as `500ms`, `5s`, `2m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    shardctl_common::time::parse_duration(s)
}

/// Installs the log subscriber; a filter that does not parse is refused (bad usage).
pub fn init_logging(args: &Args) -> Result<(), String> {
    let default = match args.command {
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
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.command {
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

/// The message of an error for the terminal: Redis's refusals of authentication and
/// permission (repeated once per pipelined command) become one sentence that says what to do.
pub fn describe(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    if text.contains("NOAUTH") {
        return "redis requires authentication: put the user and password in the URL \
                (redis://user:password@host:port), best through --redis-url-file F"
            .into();
    }
    if text.contains("NoPerm") || text.contains("NOPERM") {
        // redis's own words name the command or key; once, not once per pipelined command
        let said = text.split("error: ").nth(1).and_then(|s| s.split(')').next()).unwrap_or("");
        return format!(
            "the redis user lacks a permission shardctl needs (a command, or the keys ~{{PREFIX:*): \
             see docs/operations.md, 'Production Redis', for the minimal ACL (redis said: {said})"
        );
    }
    text
}

/// The exit code of a command line clap refused: clap's own (2; 0 for --help), except for
/// `shardctl lock`, whose own failures must not look like its command's exit codes.
pub fn usage_exit_code(e: &clap::Error) -> u8 {
    use clap::CommandFactory;
    if e.use_stderr() {
        // parsed again, as far as it goes, only to learn which subcommand was meant
        let meant = Args::command().ignore_errors(true).try_get_matches().ok();
        if meant.as_ref().and_then(|m| m.subcommand_name()) == Some("lock") {
            return exit::FAILED;
        }
    }
    e.exit_code().clamp(0, 255) as u8
}

/// Bad input exits 2, everything else 1 (`lock` maps its own: see [`exit`]).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<shardctl_common::Error>() {
        Some(shardctl_common::Error::Invalid(_) | shardctl_common::Error::Refused { .. }) => exit::USAGE,
        _ => exit::ERROR,
    }
}

/// Checks a task id given on the command line: one that cannot exist is bad usage.
pub fn task_id(id: &str) -> anyhow::Result<&str> {
    shardctl_common::names::validate_task_id(id)?;
    Ok(id)
}

/// Connects a manager, with the URL (password hidden) in the error.
pub async fn connect(args: &Args) -> anyhow::Result<(shardctl_common::conn::Endpoint, shardctl_common::conn::Conn)> {
    let endpoint = shardctl_common::conn::open(&args.redis_url()?)?;
    let con = endpoint.manager().await?;
    Ok((endpoint, con))
}

/// Writes to stdout (and a newline when `line`). `shardctl status | head -1`: when the reader
/// went away (the write fails with `BrokenPipe`), that is no error of ours, so end quietly with
/// 0 as a filter would; any other failure to write stdout (a full disk) exits 1 with a message.
/// Rust ignores SIGPIPE, and turning it back on would take `unsafe` code.
pub fn write_stdout(args: std::fmt::Arguments<'_>, line: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| if line { out.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = written.and_then(|()| if line { Ok(()) } else { out.flush() }) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(exit::ERROR.into());
    }
}
