//! `shardctl lock NAME -- CMD ARGS`: runs a command while holding a distributed lock (single
//! Redis, or Redlock with `--redlock`), renewed while it runs, with the fencing token exported as
//! `SHARDCTL_FENCING_TOKEN`.
//!
//! Its flags are here; the lock, the run and what is said of each outcome with its exit code
//! are the library's ([`shardctl::locked`]; the command's own exit code is passed through).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl::locked::{self, AnyLock, Locked};

use super::args::{duration, Args};
use super::exit;

/// The exit codes, as `shardctl lock --help` shows them (checked against [`exit`] by a test).
pub const EXIT_HELP: &str = "\
Exit status:
  the command's own exit status, when it ran and ended by itself (128+N if signal N killed it)
  123  the lock stayed held by another past --wait: the command did not run
  124  the lock was lost while the command ran: its process group was killed
  125  shardctl failed (bad usage or input, Redis unreachable, any other error)
  126  the command could not be started
  127  the command was not found
  128+N  shardctl got signal N (SIGINT 130, SIGTERM 143, SIGHUP 129): the command's process
       group got it too and ended (SIGKILL after --kill-after), then the lock was released
A command that itself exits 123 to 127 cannot be told from these (as with timeout(1)).

The command runs in a process group of its own, outside the terminal's foreground: a command
that reads from the terminal stops (SIGTTIN); give it its input by other means.";

#[derive(Debug, Parser)]
pub struct LockArgs {
    /// The lock's name: 1–128 characters of A-Z a-z 0-9 . _ : / -
    pub name: String,
    /// Time to live; renewed every third of it while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,
    /// How long to wait for the lock before giving up (exit 123).
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub wait: Duration,
    /// After SIGINT, SIGTERM or SIGHUP is sent on to the command's process group, how long it
    /// gets to end before SIGKILL (the lock is renewed meanwhile).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub kill_after: Duration,
    /// Use Redlock over these independent servers (comma-separated URLs; 3 or 5).
    #[arg(long, value_delimiter = ',')]
    pub redlock: Vec<String>,
    /// The command and its arguments (after `--`), run without a shell.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs `shardctl lock`; every outcome is an exit code of [`exit`] or the command's own.
pub async fn run(args: &Args, a: &LockArgs) -> anyhow::Result<ExitCode> {
    let code = match run_locked(args, a).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", super::exit::describe(&e));
            exit::FAILED
        }
    };
    Ok(ExitCode::from(code))
}

async fn run_locked(args: &Args, a: &LockArgs) -> anyhow::Result<u8> {
    // the URL is read only for a lock on one Redis
    let url = if a.redlock.is_empty() { args.redis_url()? } else { String::new() };
    let lock = AnyLock::open(&url, &args.prefix, &a.name, a.ttl, &a.redlock).await?;
    let cmd = Locked {
        name: a.name.clone(),
        command: a.command.iter().map(Into::into).collect(),
        wait: a.wait,
        kill_after: a.kill_after,
    };
    let (said, code) = locked::run(lock, &cmd).await?.said(&cmd);
    if let Some(said) = said {
        eprintln!("{said}");
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardctl::locked::exit;

    #[test]
    fn the_help_states_every_exit_code() {
        for code in [exit::NOT_ACQUIRED, exit::LOCK_LOST, exit::FAILED, exit::CANNOT_INVOKE, exit::NOT_FOUND] {
            assert!(EXIT_HELP.contains(&format!("\n  {code}  ")), "{code} is not in the help");
        }
        assert!(EXIT_HELP.contains(&format!("{}+N", exit::SIGNAL_BASE)));
        assert_eq!(exit::SIGNAL_BASE + 15, 143);
    }
}
