//! `shardctl lock NAME -- CMD ARGS`: runs a command while holding a distributed lock (single
//! Redis, or Redlock with `--redlock`), renewed while it runs, with the fencing token exported as
//! `SHARDCTL_FENCING_TOKEN`.
//!
//! The command runs in a process group of its own. SIGINT, SIGTERM and SIGHUP are sent on to that
//! whole group; shardctl keeps renewing the lock until the group is gone (SIGKILL after
//! `--kill-after`, or at a second signal), releases the lock, and exits 128 + the signal. A lost
//! lock SIGKILLs the group at once. shardctl's own outcomes have the codes of [`exit`], the
//! command's own exit code is passed through otherwise.

use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use shardctl_common::lock::{watchdog, Lease, LockKeys, RedisLock, Redlock};
use shardctl_common::{conn, Error};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::exit;
use super::{duration, Args};

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

enum Held {
    One(RedisLock),
    Red(Redlock),
}

impl Held {
    async fn acquire(&self, wait: Duration) -> shardctl_common::Result<Option<Lease>> {
        match self {
            Held::One(l) => l.acquire(wait).await,
            Held::Red(l) => l.acquire(wait).await,
        }
    }
    async fn release(&self, lease: &Lease) {
        let _ = match self {
            Held::One(l) => l.release(lease).await.map(|_| ()),
            Held::Red(l) => l.release(lease).await,
        };
    }
}

/// Runs `shardctl lock`; every outcome is an exit code of [`exit`] or the command's own.
pub async fn run(args: &Args, a: &LockArgs) -> anyhow::Result<ExitCode> {
    let code = match run_locked(args, a).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", super::describe(&e));
            exit::FAILED
        }
    };
    Ok(ExitCode::from(code))
}

/// SIGINT, SIGTERM and SIGHUP, listened to from the start (a signal never kills shardctl while
/// it holds the lock).
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> u8 {
        tokio::select! {
            _ = self.int.recv() => 2,
            _ = self.term.recv() => 15,
            _ = self.hup.recv() => 1,
        }
    }
}

fn signal_name(n: u8) -> &'static str {
    match n {
        1 => "HUP",
        2 => "INT",
        15 => "TERM",
        _ => "KILL",
    }
}

/// Keeps the lease renewed (the library's [`watchdog`]) until aborted; cancels `lost` when the
/// lock is lost: refused (someone else holds it), or unreachable until the TTL ran out.
async fn renew(lock: Arc<Held>, lease: Lease, lost: CancellationToken) {
    let forever = std::future::pending::<()>();
    let r = match &*lock {
        Held::One(l) => watchdog(l, &lease, forever).await,
        Held::Red(l) => watchdog(l, &lease, forever).await,
    };
    if r.is_err() {
        lost.cancel();
    }
}

/// Sends `sig` to process group `pgid` through kill(1) (the workspace forbids the unsafe a
/// direct killpg would need); signal 0 only asks whether the group exists.
async fn signal_group(pgid: u32, sig: &str) -> bool {
    tokio::process::Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pgid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Whether process group `pgid` has a member left. On Linux from /proc, not counting zombies
/// (members already dead: an init that does not reap orphans, common in containers, would keep
/// them forever); elsewhere `kill -0`.
async fn group_alive(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return signal_group(pgid, "0").await };
    if !std::path::Path::new("/proc/self/stat").exists() {
        return signal_group(pgid, "0").await;
    }
    let pgid = pgid.to_string();
    dir.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { return false };
        // pid (comm) state ppid pgrp …; comm may hold spaces and parentheses
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
        let mut f = rest.split_whitespace();
        let (state, pgrp) = (f.next(), f.nth(1));
        state.is_some_and(|s| s != "Z" && s != "X") && pgrp == Some(pgid.as_str())
    })
}

/// How the command ended.
enum End {
    /// It exited by itself (or waiting for it failed).
    Exited(std::io::Result<ExitStatus>),
    /// shardctl got this signal; the command's group was stopped.
    Signalled(u8),
    /// The lock was lost; the command's group was killed.
    Lost,
}

async fn run_locked(args: &Args, a: &LockArgs) -> anyhow::Result<u8> {
    let mut signals = Signals::new()?;
    let keys = LockKeys::new(&args.prefix, &a.name)?;
    if a.ttl < Duration::from_millis(30) {
        return Err(Error::invalid("--ttl must be at least 30ms").into());
    }
    let lock = if a.redlock.is_empty() {
        let endpoint = conn::open(&args.redis_url()?)?;
        Held::One(RedisLock::new(endpoint.manager().await?, keys, a.ttl))
    } else {
        if a.redlock.len() < 3 {
            return Err(Error::invalid("--redlock needs at least 3 independent servers").into());
        }
        let mut servers = Vec::new();
        for url in &a.redlock {
            // a server down at start still counts against the quorum: connect lazily
            let endpoint = conn::open(url)?;
            servers.push(endpoint.lazy()?);
        }
        Held::Red(Redlock::new(servers, keys, a.ttl))
    };
    let acquired = tokio::select! {
        r = lock.acquire(a.wait) => r?,
        sig = signals.recv() => {
            eprintln!("shardctl lock '{}': SIG{} while waiting for the lock: the command did not run", a.name, signal_name(sig));
            return Ok(exit::SIGNAL_BASE + sig);
        }
    };
    let Some(lease) = acquired else {
        eprintln!(
            "shardctl lock '{}': the lock is held by another (waited {:?}): the command did not run",
            a.name, a.wait
        );
        return Ok(exit::NOT_ACQUIRED);
    };
    let spawned = tokio::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("SHARDCTL_FENCING_TOKEN", lease.fencing_token.to_string())
        .env("SHARDCTL_LOCK_NAME", &a.name)
        // a group of its own: a signal or a lost lock stops whatever the command started too
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            lock.release(&lease).await;
            eprintln!("shardctl lock '{}': cannot start '{}': {e}", a.name, a.command[0]);
            let code = if e.kind() == std::io::ErrorKind::NotFound { exit::NOT_FOUND } else { exit::CANNOT_INVOKE };
            return Ok(code);
        }
    };
    // the group's id is the child's pid; known until the child is reaped, and kept after
    let pgid = child.id().expect("a child not yet waited for has a pid");
    let lock = Arc::new(lock);
    let lost = CancellationToken::new();
    let renewer = tokio::spawn(renew(lock.clone(), lease.clone(), lost.clone()));
    let end = tokio::select! {
        status = child.wait() => End::Exited(status),
        sig = signals.recv() => {
            stop(&mut child, pgid, Some(sig), a.kill_after, &mut signals, &lost).await;
            if lost.is_cancelled() { End::Lost } else { End::Signalled(sig) }
        }
        _ = lost.cancelled() => {
            stop(&mut child, pgid, None, a.kill_after, &mut signals, &lost).await;
            End::Lost
        }
    };
    renewer.abort();
    // compare and delete: a lock taken over since is left to its holder
    lock.release(&lease).await;
    Ok(match end {
        End::Exited(Ok(status)) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(c), _) => c.clamp(0, 255) as u8,
                (None, Some(s)) => exit::SIGNAL_BASE.saturating_add(s.clamp(0, 127) as u8),
                (None, None) => exit::FAILED,
            }
        }
        End::Exited(Err(e)) => {
            eprintln!("error: lock '{}': waiting for the command: {e}", a.name);
            exit::FAILED
        }
        End::Signalled(sig) => {
            eprintln!(
                "shardctl lock '{}': SIG{}: the command's process group was stopped and the lock released",
                a.name,
                signal_name(sig)
            );
            exit::SIGNAL_BASE + sig
        }
        End::Lost => {
            eprintln!("error: lock '{}' was lost while the command ran: its process group was killed", a.name);
            exit::LOCK_LOST
        }
    })
}

/// Stops the command's process group and waits until none of it is left: `sig` first (none: the
/// lock is lost, SIGKILL at once), SIGKILL after `kill_after`, at a second signal, or as soon as
/// the lock is lost (the lock is renewed meanwhile).
async fn stop(
    child: &mut tokio::process::Child,
    pgid: u32,
    sig: Option<u8>,
    kill_after: Duration,
    signals: &mut Signals,
    lost: &CancellationToken,
) {
    let mut killed_at = None;
    match sig {
        Some(s) => {
            signal_group(pgid, signal_name(s)).await;
        }
        None => {
            signal_group(pgid, "KILL").await;
            killed_at = Some(Instant::now());
        }
    }
    let deadline = tokio::time::Instant::now() + kill_after;
    let mut leader_gone = false;
    loop {
        if leader_gone && !group_alive(pgid).await {
            return;
        }
        // after SIGKILL the group ends at once; a member the kernel cannot end yet (in
        // uninterruptible sleep) must not keep shardctl and the lock forever
        if killed_at.is_some_and(|t: Instant| t.elapsed() > Duration::from_secs(2)) {
            eprintln!("warning: the command's process group {pgid} is not gone 2s after SIGKILL");
            return;
        }
        let kill = tokio::select! {
            _ = child.wait(), if !leader_gone => {
                // what the command started may still be ending in its group
                leader_gone = true;
                false
            }
            _ = tokio::time::sleep(Duration::from_millis(20)), if leader_gone => false,
            _ = tokio::time::sleep_until(deadline), if killed_at.is_none() => true,
            _ = signals.recv(), if killed_at.is_none() => true,
            _ = lost.cancelled(), if killed_at.is_none() => true,
        };
        if kill {
            signal_group(pgid, "KILL").await;
            killed_at = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_states_every_exit_code() {
        for code in [exit::NOT_ACQUIRED, exit::LOCK_LOST, exit::FAILED, exit::CANNOT_INVOKE, exit::NOT_FOUND] {
            assert!(EXIT_HELP.contains(&format!("\n  {code}  ")), "{code} is not in the help");
        }
        assert!(EXIT_HELP.contains(&format!("{}+N", exit::SIGNAL_BASE)));
        assert_eq!(exit::SIGNAL_BASE + 15, 143);
    }
}
