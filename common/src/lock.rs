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

/// Backoff between acquisition attempts: 10 ms doubling to 500 ms, jittered (a lock is retaken
/// sooner than a Redis outage is over: shorter than [`crate::backoff::redis_retry`]).
fn retry_pause(attempt: u32) -> Duration {
    crate::backoff::capped(
        crate::backoff::Backoff::Exponential(Duration::from_millis(10)),
        attempt + 1,
        Duration::from_millis(500),
    )
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

    /// Renews `lease` until `stop` resolves: see [`watchdog`].
    pub async fn watchdog(&self, lease: &Lease, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        watchdog(self, lease, stop).await
    }
}

/// A lock whose lease can be renewed: [`RedisLock`] and [`Redlock`].
pub trait Renewable {
    /// Renews the lease for another TTL; false when the lock no longer holds it.
    fn renew(&self, lease: &Lease) -> impl std::future::Future<Output = Result<bool>> + Send;
    /// The lease's time to live.
    fn ttl(&self) -> Duration;
    /// The lock's key, for messages.
    fn key(&self) -> &str;
}

/// Both locks renew by `extend`, with their `ttl` and `keys.lock`: one impl for each.
macro_rules! renewable {
    ($($lock:ty),*) => {$(
        impl Renewable for $lock {
            fn renew(&self, lease: &Lease) -> impl std::future::Future<Output = Result<bool>> + Send {
                self.extend(lease)
            }
            fn ttl(&self) -> Duration {
                self.ttl
            }
            fn key(&self) -> &str {
                &self.keys.lock
            }
        }
    )*};
}
renewable!(RedisLock, Redlock);

/// The one renewal loop of a held lock: renews `lease` every third of the TTL until `stop`
/// resolves (`Ok`: still held). [`Error::LockLost`] as soon as the lock is lost: a renewal
/// refused (it expired, or another holder took it), or none succeeded for a whole TTL (Redis
/// unreachable: the lease ran out meanwhile, so another may hold the lock now). A failed renewal
/// is retried at the next period while the TTL lasts.
pub async fn watchdog<L: Renewable>(
    lock: &L,
    lease: &Lease,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(stop);
    let ttl = lock.ttl();
    let period = (ttl / 3).max(Duration::from_millis(10));
    let mut renewed = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(renewed + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tick.tick() => {}
        }
        let held = match lock.renew(lease).await {
            Ok(true) => {
                renewed = tokio::time::Instant::now();
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!("renewing lock {}: {e}", lock.key());
                renewed.elapsed() < ttl
            }
        };
        if !held {
            return Err(Error::LockLost(lock.key().to_owned()));
        }
    }
}

/// A test hook: a future awaited by [`Redlock::try_acquire`] between taking the lock and raising
/// the fence (see [`Redlock::pause_before_fence`]).
type PauseHook =
    std::sync::Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Redlock over N independent Redis servers: held when a majority holds it.
#[derive(Clone)]
pub struct Redlock {
    servers: Vec<Conn>,
    keys: LockKeys,
    ttl: Duration,
    pause: Option<PauseHook>,
}

/// Clock drift allowed for, per Redlock: 1% of the TTL plus 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

impl Redlock {
    /// Redlock over `servers` (use an odd number: 3 or 5).
    pub fn new(servers: Vec<Conn>, keys: LockKeys, ttl: Duration) -> Self {
        Redlock { servers, keys, ttl, pause: None }
    }

    /// For tests only: every attempt awaits `hook()` after the lock is taken on a quorum and
    /// before the fence is raised, which stands for a process paused (GC, swap, SIGSTOP) at the
    /// worst moment. Not part of the API.
    #[doc(hidden)]
    pub fn pause_before_fence<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.pause = Some(std::sync::Arc::new(move || Box::pin(hook())));
        self
    }

    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// One attempt: the lock on a majority within its validity, else released everywhere.
    ///
    /// 1. `lock_acquire.lua` on every server in parallel (SET NX PX, and `INCR` of that server's
    ///    fence where it succeeded), each bounded by `per_server`;
    /// 2. the fencing token is the highest fence of the quorum's replies; `fence_raise.lua`
    ///    raises every holder's fence to it, in parallel, each bounded by `per_server`;
    /// 3. only then is the time checked: if TTL − drift has passed since before step 1, the
    ///    attempt gives up (released everywhere, `None`); else the validity is what is left.
    ///
    /// Why a holder whose validity is spent can never carry a fence above a later holder's: a
    /// lease is returned only if its fence was on a quorum before its validity ran out, so
    /// before its keys could expire on that quorum; a later holder's quorum shares a server
    /// with it and takes its fence from `INCR` there, so it is strictly higher. An attempt
    /// paused past its validity (GC, swap, SIGSTOP) gives up whatever fence it got.
    pub async fn try_acquire(&self) -> Result<Option<Lease>> {
        let token = new_token();
        // validity is measured from here, before the first server is asked
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
                match tokio::time::timeout(per_server, call).await {
                    Ok(Ok(f)) if f > 0 => Some(f),
                    _ => None,
                }
            }
        });
        let fences: Vec<Option<u64>> = join_all(attempts).await;
        let holders: Vec<usize> = fences.iter().enumerate().filter(|(_, f)| f.is_some()).map(|(i, _)| i).collect();
        if holders.len() < self.quorum() || self.validity_left(start).is_none() {
            self.release_all(&token).await;
            return Ok(None);
        }
        if let Some(pause) = &self.pause {
            pause().await;
        }
        // fencing across servers: the quorum's highest fence, raised on all of it at once
        let fencing_token = fences.iter().flatten().copied().max().unwrap_or(1);
        let raises = holders.iter().map(|&i| {
            let (mut con, fence) = (self.servers[i].clone(), self.keys.fence.clone());
            async move {
                let mut inv = scripts().fence_raise.key(&fence);
                inv.arg(fencing_token);
                let call = inv.invoke_async::<u64>(&mut con);
                matches!(tokio::time::timeout(per_server, call).await, Ok(Ok(f)) if f >= fencing_token)
            }
        });
        let raised = join_all(raises).await.into_iter().filter(|r| *r).count();
        // without the fence on a majority the next holder might not see it; past the validity a
        // later holder may already have its own (lower) fence
        let validity = self.validity_left(start);
        match validity {
            Some(validity) if raised >= self.quorum() => Ok(Some(Lease { token, fencing_token, validity })),
            _ => {
                self.release_all(&token).await;
                Ok(None)
            }
        }
    }

    /// What is left of the TTL, minus drift, since `start`; `None` once spent.
    fn validity_left(&self, start: Instant) -> Option<Duration> {
        self.ttl.checked_sub(start.elapsed() + drift(self.ttl)).filter(|v| !v.is_zero())
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
