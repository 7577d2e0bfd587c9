//! Distributed locks for users and for the project itself: a single-Redis lock (SET NX PX with a
//! random token, watchdog renewal, compare-and-delete release) and Redlock over N independent
//! Redis servers (quorum, validity = TTL − elapsed − clock drift, release on all). Every
//! acquisition returns a fencing token that rises with each acquisition of the same name, so a
//! guarded resource can refuse a holder whose lock has expired meanwhile.
//!
//! Key names: `{<prefix>:lock:<name>}` and its fence `{<prefix>:lock:<name>}:fence` (one slot).

use std::time::{Duration, Instant};

use crate::conn::Conn;

use crate::error::{Error, Result};
use crate::scripts::scripts;

/// Longest lock name, in bytes.
pub const MAX_NAME: usize = crate::names::MAX_LOCK_NAME_LEN;

/// The keys of lock `name`.
#[derive(Debug, Clone)]
pub struct LockKeys {
    /// The lock: the holder's token, with a TTL.
    pub lock: String,
    /// The last fencing token handed out.
    pub fence: String,
}

impl LockKeys {
    /// Keys of lock `name` under `prefix`: the name is 1–128 bytes of `[A-Za-z0-9._:/-]`, the
    /// prefix follows the key prefix's rule (see [`crate::names`], which shows why no two names
    /// share a key); `Error::Invalid` otherwise.
    pub fn new(prefix: &str, name: &str) -> Result<Self> {
        crate::names::validate_prefix(prefix)?;
        crate::names::validate_lock_name(name)?;
        let lock = format!("{{{prefix}:lock:{name}}}");
        Ok(LockKeys { fence: format!("{lock}:fence"), lock })
    }
}

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The random token that holds the lock.
    pub token: String,
    /// Rises with every acquisition of this lock name.
    pub fencing_token: u64,
    /// For Redlock: how long the lock is certainly held from acquisition (TTL minus the time
    /// acquisition took minus clock drift). For a single Redis: the TTL.
    pub validity: Duration,
}

fn new_token() -> String {
    // unique is all a lock token needs: the clock, the process and a process-wide counter
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{t:x}-{}-{:x}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Backoff between acquisition attempts: 10 ms doubling to 500 ms, with jitter from the clock.
fn retry_pause(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(6);
    let jitter = u64::from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos(),
    ) % (base / 2 + 1);
    Duration::from_millis((base / 2 + jitter).min(500))
}

/// Calls `attempt` until it returns a lease or `wait` has passed, pausing between tries.
async fn retry_until<F, Fut>(wait: Duration, mut attempt: F) -> Result<Option<Lease>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Lease>>>,
{
    let deadline = Instant::now() + wait;
    let mut tries = 0;
    loop {
        if let Some(l) = attempt().await? {
            return Ok(Some(l));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(retry_pause(tries).min(deadline - now)).await;
        tries += 1;
    }
}

/// A lock on one Redis server.
#[derive(Clone)]
pub struct RedisLock {
    con: Conn,
    keys: LockKeys,
    ttl: Duration,
}

impl RedisLock {
    /// Lock `keys` on the server behind `con`, held for `ttl` unless renewed.
    pub fn new(con: Conn, keys: LockKeys, ttl: Duration) -> Self {
        RedisLock { con, keys, ttl }
    }

    /// One attempt; `None` when another holder has it.
    pub async fn try_acquire(&self) -> Result<Option<Lease>> {
        let token = new_token();
        let mut con = self.con.clone();
        let fence: u64 = scripts()
            .lock_acquire
            .key(&self.keys.lock)
            .key(&self.keys.fence)
            .arg(&token)
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(&mut con)
            .await?;
        Ok((fence > 0).then_some(Lease { token, fencing_token: fence, validity: self.ttl }))
    }

    /// Tries until `wait` has passed; `None` when the lock stayed taken.
    pub async fn acquire(&self, wait: Duration) -> Result<Option<Lease>> {
        retry_until(wait, || self.try_acquire()).await
    }

    /// Renews the TTL; false when the lease no longer holds the lock (it is lost).
    pub async fn extend(&self, lease: &Lease) -> Result<bool> {
        let mut con = self.con.clone();
        let r: i64 = scripts()
            .lock_extend
            .key(&self.keys.lock)
            .arg(&lease.token)
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(&mut con)
            .await?;
        Ok(r == 1)
    }

    /// Releases the lock if the lease still holds it (compare and delete).
    pub async fn release(&self, lease: &Lease) -> Result<bool> {
        let mut con = self.con.clone();
        crate::scripts::unlock(&mut con, &self.keys.lock, &lease.token).await
    }

    /// Renews the lease every TTL/3 until `stop` resolves; returns `Err` as soon as the lock is
    /// lost (someone else holds it, or it expired), `Ok` when stopped while still held.
    pub async fn watchdog(&self, lease: &Lease, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(stop);
        let period = (self.ttl / 3).max(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(period) => {}
            }
            match self.extend(lease).await {
                Ok(true) => {}
                Ok(false) => return Err(Error::invalid(format!("lock {} lost", self.keys.lock))),
                // a failed renewal is retried at the next period while the TTL lasts
                Err(e) => tracing::warn!("renewing lock {}: {e}", self.keys.lock),
            }
        }
    }
}

/// Redlock over N independent Redis servers: held when a majority holds it.
#[derive(Clone)]
pub struct Redlock {
    servers: Vec<Conn>,
    keys: LockKeys,
    ttl: Duration,
}

/// Clock drift allowed for, per Redlock: 1% of the TTL plus 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

impl Redlock {
    /// Redlock over `servers` (use an odd number: 3 or 5).
    pub fn new(servers: Vec<Conn>, keys: LockKeys, ttl: Duration) -> Self {
        Redlock { servers, keys, ttl }
    }

    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// One attempt: the lock on a majority within its validity, else released everywhere.
    pub async fn try_acquire(&self) -> Result<Option<Lease>> {
        let token = new_token();
        let start = Instant::now();
        let ttl_ms = self.ttl.as_millis() as u64;
        // each server gets a short chance: a dead one must not eat the validity
        let per_server = (self.ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(200));
        let attempts = self.servers.iter().cloned().map(|mut con| {
            let (keys, token) = (self.keys.clone(), token.clone());
            async move {
                let mut inv = scripts().lock_acquire.key(&keys.lock);
                inv.key(&keys.fence).arg(&token).arg(ttl_ms);
                let call = inv.invoke_async::<u64>(&mut con);
                matches!(tokio::time::timeout(per_server, call).await, Ok(Ok(f)) if f > 0)
            }
        });
        let held: Vec<bool> = join_all(attempts).await;
        let holders: Vec<usize> = held.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i).collect();
        let elapsed = start.elapsed();
        let validity = self.ttl.checked_sub(elapsed + drift(self.ttl));
        let Some(validity) = validity.filter(|_| holders.len() >= self.quorum()) else {
            self.release_all(&token).await;
            return Ok(None);
        };
        // fencing across servers: read the quorum's highest fence, raise all of it one above
        let mut highest = 0u64;
        for &i in &holders {
            let mut con = self.servers[i].clone();
            let f: Option<u64> = tokio::time::timeout(
                per_server,
                scripts().fence_raise.key(&self.keys.fence).arg(0).invoke_async(&mut con),
            )
            .await
            .ok()
            .and_then(|r| r.ok());
            highest = highest.max(f.unwrap_or(0));
        }
        let fencing_token = highest + 1;
        let mut raised = 0;
        for &i in &holders {
            let mut con = self.servers[i].clone();
            let r = tokio::time::timeout(
                per_server,
                scripts().fence_raise.key(&self.keys.fence).arg(fencing_token).invoke_async::<u64>(&mut con),
            )
            .await;
            if matches!(r, Ok(Ok(_))) {
                raised += 1;
            }
        }
        if raised < self.quorum() {
            // without the fence on a majority the next holder might not see it
            self.release_all(&token).await;
            return Ok(None);
        }
        Ok(Some(Lease { token, fencing_token, validity }))
    }

    /// Tries until `wait` has passed.
    pub async fn acquire(&self, wait: Duration) -> Result<Option<Lease>> {
        retry_until(wait, || self.try_acquire()).await
    }

    /// Extends on every server; true while a majority still holds the lease.
    pub async fn extend(&self, lease: &Lease) -> Result<bool> {
        let ttl_ms = self.ttl.as_millis() as u64;
        let calls = self.servers.iter().cloned().map(|mut con| {
            let (key, token) = (self.keys.lock.clone(), lease.token.clone());
            async move {
                let mut inv = scripts().lock_extend.key(&key);
                inv.arg(&token).arg(ttl_ms);
                let call = inv.invoke_async::<i64>(&mut con);
                matches!(tokio::time::timeout(Duration::from_millis(200), call).await, Ok(Ok(1)))
            }
        });
        let ok = join_all(calls).await.into_iter().filter(|b| *b).count();
        Ok(ok >= self.quorum())
    }

    /// Releases on every server (those that do not hold it ignore it).
    pub async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_all(&lease.token).await;
        Ok(())
    }

    async fn release_all(&self, token: &str) {
        let calls = self.servers.iter().cloned().map(|mut con| {
            let (key, token) = (self.keys.lock.clone(), token.to_owned());
            async move {
                let _ =
                    tokio::time::timeout(Duration::from_millis(200), crate::scripts::unlock(&mut con, &key, &token))
                        .await;
            }
        });
        join_all(calls).await;
    }
}

/// Runs futures concurrently and collects their outputs in order (no extra dependency).
async fn join_all<F: std::future::Future + Send + 'static>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("lock call panicked"));
    }
    out
}
