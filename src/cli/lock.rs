//! `shardctl lock NAME -- CMD ARGS`: runs a command while holding a distributed lock (single
//! Redis, or Redlock with `--redlock`), renewed while it runs, with the fencing token exported as
//! `SHARDCTL_FENCING_TOKEN`. If the lock is lost the command is killed and the exit is 4.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardctl_common::lock::{Lease, LockKeys, RedisLock, Redlock};
use shardctl_common::{conn, Error};

use super::{duration, Args};

/// Exit code when the lock was lost while the command ran.
pub const EXIT_LOCK_LOST: u8 = 4;

#[derive(Debug, Parser)]
pub struct LockArgs {
    /// The lock's name: 1–128 characters of A-Z a-z 0-9 . _ : / -
    pub name: String,
    /// Time to live; renewed every third of it while the command runs.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,
    /// How long to wait for the lock before giving up (exit 1).
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub wait: Duration,
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
    async fn extend(&self, lease: &Lease) -> shardctl_common::Result<bool> {
        match self {
            Held::One(l) => l.extend(lease).await,
            Held::Red(l) => l.extend(lease).await,
        }
    }
    async fn release(&self, lease: &Lease) {
        let _ = match self {
            Held::One(l) => l.release(lease).await.map(|_| ()),
            Held::Red(l) => l.release(lease).await,
        };
    }
}

pub async fn run(args: &Args, a: &LockArgs) -> anyhow::Result<ExitCode> {
    let keys = LockKeys::new(&args.prefix, &a.name)?;
    if a.ttl < Duration::from_millis(30) {
        return Err(Error::invalid("--ttl must be at least 30ms").into());
    }
    let lock = if a.redlock.is_empty() {
        let client = conn::open(&args.redis_url()?)?;
        Held::One(RedisLock::new(client.manager().await?, keys, a.ttl))
    } else {
        if a.redlock.len() < 3 {
            return Err(Error::invalid("--redlock needs at least 3 independent servers").into());
        }
        let mut servers = Vec::new();
        for url in &a.redlock {
            // a server down at start still counts against the quorum: connect lazily
            let client = conn::open(url)?;
            servers.push(client.lazy()?);
        }
        Held::Red(Redlock::new(servers, keys, a.ttl))
    };
    let Some(lease) = lock.acquire(a.wait).await? else {
        anyhow::bail!("lock '{}' is held by another (waited {:?})", a.name, a.wait);
    };
    let spawned = tokio::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("SHARDCTL_FENCING_TOKEN", lease.fencing_token.to_string())
        .env("SHARDCTL_LOCK_NAME", &a.name)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            lock.release(&lease).await;
            return Err(Error::invalid(format!("cannot start '{}': {e}", a.command[0])).into());
        }
    };
    let period = (a.ttl / 3).max(Duration::from_millis(10));
    let mut renewed = std::time::Instant::now();
    let code = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                break ExitCode::from(status.code().map_or(1, |c| c.clamp(0, 255) as u8));
            }
            _ = tokio::time::sleep(period) => {
                // refused: someone else holds it; unreachable: lost once the TTL has run out
                let lost = match lock.extend(&lease).await {
                    Ok(true) => {
                        renewed = std::time::Instant::now();
                        false
                    }
                    Ok(false) => true,
                    Err(e) => {
                        eprintln!("warning: renewing lock '{}': {e}", a.name);
                        renewed.elapsed() >= a.ttl
                    }
                };
                if lost {
                    let _ = child.kill().await;
                    eprintln!("error: lock '{}' was lost while the command ran: it was killed", a.name);
                    return Ok(ExitCode::from(EXIT_LOCK_LOST));
                }
            }
        }
    };
    lock.release(&lease).await;
    Ok(code)
}
