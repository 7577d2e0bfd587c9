//! Running a command under a distributed lock (what `shardctl lock` does): the lock is taken
//! (waiting up to a bound), the command runs in a process group of its own with the fencing
//! token in `SHARDCTL_FENCING_TOKEN`, the lock is renewed by [`watchdog`] while it runs, and:
//! - SIGINT, SIGTERM or SIGHUP to this process is sent on to the command's whole group, which
//!   gets `kill_after` to end (SIGKILL then, or at a second signal) while the lock is renewed;
//! - a lost lock SIGKILLs the group at once;
//! - the lock is released (compare and delete) once nothing of the group is left.
//!
//! [`run`] returns how it ended ([`Ended`]); [`Ended::said`] gives what to say of it and the
//! exit code `shardctl lock` ends with ([`exit`]).

use std::ffi::OsString;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardctl_common::lock::{watchdog, Lease, LockKeys, RedisLock, Redlock};
use shardctl_common::{conn, Error, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A lock on one Redis or Redlock over several.
pub enum AnyLock {
    /// One Redis.
    One(RedisLock),
    /// Redlock over independent servers.
    Red(Redlock),
}

/// The exit codes of `shardctl lock` for its own outcomes. It passes its command's exit status
/// through, so, like timeout(1) and env(1), it takes codes a command rarely uses (123 to 127,
/// 128 + n).
pub mod exit {
    /// The lock stayed held by another past `--wait`; the command did not run.
    pub const NOT_ACQUIRED: u8 = 123;
    /// The lock was lost while the command ran (or while it was being stopped): its process
    /// group was killed.
    pub const LOCK_LOST: u8 = 124;
    /// shardctl itself failed: bad usage or input, Redis unreachable, any other error.
    pub const FAILED: u8 = 125;
    /// The command was found but could not be started (permission, not executable).
    pub const CANNOT_INVOKE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
    /// shardctl was stopped by signal `n` (SIGINT, SIGTERM, SIGHUP), or the command was killed
    /// by signal `n` (as a shell reports it): 128 + n.
    pub const SIGNAL_BASE: u8 = 128;
}

impl AnyLock {
    /// Lock `name` under `prefix` with time to live `ttl`: on the Redis of `url`, or, when
    /// `redlock` names servers (at least 3), Redlock over them (a server down at start still
    /// counts against the quorum: each is connected lazily).
    pub async fn open(url: &str, prefix: &str, name: &str, ttl: Duration, redlock: &[String]) -> Result<AnyLock> {
        let keys = LockKeys::new(prefix, name)?;
        if ttl < Duration::from_millis(30) {
            return Err(Error::invalid("--ttl must be at least 30ms"));
        }
        if redlock.is_empty() {
            return Ok(AnyLock::One(RedisLock::new(conn::open(url)?.manager().await?, keys, ttl)));
        }
        if redlock.len() < 3 {
            return Err(Error::invalid("--redlock needs at least 3 independent servers"));
        }
        let servers = redlock.iter().map(|url| conn::open(url)?.lazy()).collect::<Result<Vec<_>>>()?;
        Ok(AnyLock::Red(Redlock::new(servers, keys, ttl)))
    }

    async fn acquire(&self, wait: Duration) -> Result<Option<Lease>> {
        match self {
            AnyLock::One(l) => l.acquire(wait).await,
            AnyLock::Red(l) => l.acquire(wait).await,
        }
    }
    async fn release(&self, lease: &Lease) {
        let _ = match self {
            AnyLock::One(l) => l.release(lease).await.map(|_| ()),
            AnyLock::Red(l) => l.release(lease).await,
        };
    }
}

/// The command to run under the lock.
pub struct Locked {
    /// The lock's name, exported as `SHARDCTL_LOCK_NAME`.
    pub name: String,
    /// The program and its arguments (no shell).
    pub command: Vec<OsString>,
    /// How long to wait for the lock.
    pub wait: Duration,
    /// After a signal is sent on to the command's group, how long it gets before SIGKILL.
    pub kill_after: Duration,
}

/// How a run ended.
#[derive(Debug)]
pub enum Ended {
    /// The lock stayed held by another past the wait: the command did not run.
    NotAcquired,
    /// This process got signal N while waiting for the lock: the command did not run.
    SignalledWhileWaiting(u8),
    /// The command could not be started.
    CannotStart(std::io::Error),
    /// The command ended by itself with this status.
    Exited(ExitStatus),
    /// Waiting for the command failed.
    WaitFailed(std::io::Error),
    /// This process got signal N; the command's group was stopped.
    Signalled(u8),
    /// The lock was lost; the command's group was killed.
    Lost,
}

impl Ended {
    /// What to say on stderr of how the run of `cmd` ended (nothing when the command ended by
    /// itself), and the exit code: one of [`exit`], or the command's own.
    pub fn said(&self, cmd: &Locked) -> (Option<String>, u8) {
        use std::os::unix::process::ExitStatusExt;
        let name = &cmd.name;
        let program = cmd.command.first().map(|p| p.to_string_lossy()).unwrap_or_default();
        match self {
            Ended::SignalledWhileWaiting(sig) => (
                Some(format!(
                    "shardctl lock '{name}': SIG{} while waiting for the lock: the command did not run",
                    signal_name(*sig)
                )),
                exit::SIGNAL_BASE + sig,
            ),
            Ended::NotAcquired => (
                Some(format!(
                    "shardctl lock '{name}': the lock is held by another (waited {:?}): the command did not run",
                    cmd.wait
                )),
                exit::NOT_ACQUIRED,
            ),
            Ended::CannotStart(e) => (
                Some(format!("shardctl lock '{name}': cannot start '{program}': {e}")),
                if e.kind() == std::io::ErrorKind::NotFound { exit::NOT_FOUND } else { exit::CANNOT_INVOKE },
            ),
            Ended::Exited(status) => match (status.code(), status.signal()) {
                (Some(c), _) => (None, c.clamp(0, 255) as u8),
                (None, Some(s)) => (None, exit::SIGNAL_BASE.saturating_add(s.clamp(0, 127) as u8)),
                (None, None) => (None, exit::FAILED),
            },
            Ended::WaitFailed(e) => (Some(format!("error: lock '{name}': waiting for the command: {e}")), exit::FAILED),
            Ended::Signalled(sig) => (
                Some(format!(
                    "shardctl lock '{name}': SIG{}: the command's process group was stopped and the lock released",
                    signal_name(*sig)
                )),
                exit::SIGNAL_BASE + sig,
            ),
            Ended::Lost => (
                Some(format!("error: lock '{name}' was lost while the command ran: its process group was killed")),
                exit::LOCK_LOST,
            ),
        }
    }
}

/// Takes `lock`, runs the command under it, releases it; see the module's text.
pub async fn run(lock: AnyLock, cmd: &Locked) -> Result<Ended> {
    let mut signals =
        Signals::new().map_err(|e| shardctl_common::Error::Unreachable(format!("listening for signals: {e}")))?;
    let acquired = tokio::select! {
        r = lock.acquire(cmd.wait) => r?,
        sig = signals.recv() => return Ok(Ended::SignalledWhileWaiting(sig)),
    };
    let Some(lease) = acquired else { return Ok(Ended::NotAcquired) };
    let Some((program, args)) = cmd.command.split_first() else {
        lock.release(&lease).await;
        return Ok(Ended::CannotStart(std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command")));
    };
    let spawned = tokio::process::Command::new(program)
        .args(args)
        .env("SHARDCTL_FENCING_TOKEN", lease.fencing_token.to_string())
        .env("SHARDCTL_LOCK_NAME", &cmd.name)
        // a group of its own: a signal or a lost lock stops whatever the command started too
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            lock.release(&lease).await;
            return Ok(Ended::CannotStart(e));
        }
    };
    // the group's id is the child's pid; known until the child is reaped, and kept after
    let pgid = child.id().expect("a child not yet waited for has a pid");
    let lock = Arc::new(lock);
    let lost = CancellationToken::new();
    let renewer = tokio::spawn(renew(lock.clone(), lease.clone(), lost.clone()));
    let end = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => Ended::Exited(s),
            Err(e) => Ended::WaitFailed(e),
        },
        sig = signals.recv() => {
            stop(&mut child, pgid, Some(sig), cmd.kill_after, &mut signals, &lost).await;
            if lost.is_cancelled() { Ended::Lost } else { Ended::Signalled(sig) }
        }
        _ = lost.cancelled() => {
            stop(&mut child, pgid, None, cmd.kill_after, &mut signals, &lost).await;
            Ended::Lost
        }
    };
    renewer.abort();
    // compare and delete: a lock taken over since is left to its holder
    lock.release(&lease).await;
    Ok(end)
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

/// The name of signal `n` as kill(1) takes it.
pub fn signal_name(n: u8) -> &'static str {
    match n {
        1 => "HUP",
        2 => "INT",
        15 => "TERM",
        _ => "KILL",
    }
}

/// Keeps the lease renewed (the library's [`watchdog`]) until aborted; cancels `lost` when the
/// lock is lost: refused (someone else holds it), or unreachable until the TTL ran out.
async fn renew(lock: Arc<AnyLock>, lease: Lease, lost: CancellationToken) {
    let forever = std::future::pending::<()>();
    let r = match &*lock {
        AnyLock::One(l) => watchdog(l, &lease, forever).await,
        AnyLock::Red(l) => watchdog(l, &lease, forever).await,
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
            tracing::warn!(
                "SIG{0} sent on to the command's process group {pgid}: it has {1} to end before \
                 SIGKILL (the lock stays held meanwhile); a second signal kills it at once",
                signal_name(s),
                humantime::format_duration(kill_after)
            );
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
            tracing::warn!("the command's process group {pgid} is not gone 2s after SIGKILL");
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
            if sig.is_some() {
                tracing::warn!("SIGKILL to the command's process group {pgid}");
            }
            signal_group(pgid, "KILL").await;
            killed_at = Some(Instant::now());
        }
    }
}
