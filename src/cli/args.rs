//! The options every command takes ([`Args`]: Redis, queue, prefix, logs) and the values the
//! commands parse from their own arguments (durations, task ids).

use std::time::Duration;

use shardctl_common::Home;

/// The heading of the options every command takes.
pub(crate) const GLOBAL: &str = "Global options";

/// The options every command takes (global options).
#[derive(Debug, clap::Args)]
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
        Ok(Some(shardctl_common::conn::url_from_file(path)?))
    }
    pub(crate) fn redis_url(&self) -> anyhow::Result<String> {
        Ok(self.given_redis()?.unwrap_or_else(|| DEFAULT_REDIS.to_owned()))
    }
    /// The queue's keys; clap has checked both names already, `Keys::new` checks them again.
    pub(crate) fn home(&self) -> anyhow::Result<Home> {
        Ok(Home::new(&self.prefix, &self.queue)?)
    }
}

pub(crate) fn queue_name(s: &str) -> Result<String, String> {
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
