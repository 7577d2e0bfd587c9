//! Durability across a failover (`docs/design/durability.md`): a queue's mode, stored in its
//! home's `meta`; [`confirm`], the one way a process learns that a state it read reached a
//! replica; [`Follow`], the mode as a running process follows it; [`Waiter`], what a process's
//! confirmations need.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Pipeline, Value};

use crate::error::{Error, Result};
use crate::{Home, Keys};

/// The wait of one confirmation when none is set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Shortest and longest wait a queue may set: a wait blocks its connection, whose response
/// timeout ([`crate::conn::RESPONSE_TIMEOUT`]) it must stay well within.
pub const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(5));
/// A running process reads the mode again once this has passed since it last read it.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(2);

/// What a confirmed write must have reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Nothing is waited for.
    #[default]
    None,
    /// One replica acknowledged it (`WAIT 1`).
    Replica,
}

impl Mode {
    /// Parses `none` or `replica`. A mode that waits for the master's AOF (`WAITAOF`) needs
    /// Redis 7.2, and is refused with that reason.
    pub fn parse(s: &str) -> Result<Mode> {
        match s {
            "none" => Ok(Mode::None),
            "replica" => Ok(Mode::Replica),
            "fsync" | "replica+fsync" | "fsync+replica" => Err(Error::invalid(format!(
                "durability '{s}' is not built: waiting for the master's AOF needs WAITAOF (Redis 7.2); \
                 expected none or replica"
            ))),
            _ => Err(Error::invalid(format!("durability '{s}': expected none or replica"))),
        }
    }

    /// Its name as [`Mode::parse`] takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Replica => "replica",
        }
    }

    /// What the wait of this mode asks for, for messages.
    pub fn wants(self) -> &'static str {
        match self {
            Mode::None => "nothing",
            Mode::Replica => "a replica's acknowledgement",
        }
    }
}

/// A queue's durability: its mode and how long one wait may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    /// What a confirmed write reached.
    pub mode: Mode,
    /// How long one confirmation waits before it reports a timeout (and is repeated).
    pub timeout: Duration,
}

impl Default for Durability {
    fn default() -> Self {
        Durability { mode: Mode::None, timeout: DEFAULT_TIMEOUT }
    }
}

impl Durability {
    /// Refuses a timeout outside [`TIMEOUT_RANGE`].
    pub fn validate(&self) -> Result<()> {
        let (lo, hi) = TIMEOUT_RANGE;
        if self.timeout < lo || self.timeout > hi {
            return Err(Error::invalid(format!(
                "--durability-timeout {:?}: expected {lo:?} to {hi:?} (a wait blocks its connection)",
                self.timeout
            )));
        }
        Ok(())
    }

    /// True unless the mode is `none`.
    pub fn waits(&self) -> bool {
        self.mode != Mode::None
    }

    fn wait_cmd(&self) -> redis::Cmd {
        redis::cmd("WAIT").arg(1).arg(self.timeout.as_millis() as u64).to_owned()
    }

    /// Whether the wait's reply shows what the mode asks for, and what it showed.
    fn acknowledged(&self, reply: &Value) -> (bool, String) {
        let n = redis::from_redis_value::<i64>(reply.clone()).unwrap_or(0);
        (n >= 1, format!("replicas acknowledged: {n}"))
    }
}

/// Reads a queue's durability from its home's `meta` (the default when none is set).
pub async fn read<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Durability> {
    let (mode, ms): (Option<String>, Option<u64>) =
        redis::cmd("HMGET").arg(home.meta()).arg(&["durability", "durability_timeout_ms"]).query_async(con).await?;
    let mode = match mode.as_deref() {
        None | Some("") => Mode::None,
        Some(m) => Mode::parse(m).map_err(|_| Error::Protocol(format!("durability '{m}' in the queue's meta")))?,
    };
    Ok(Durability { mode, timeout: ms.map(Duration::from_millis).unwrap_or(DEFAULT_TIMEOUT) })
}

/// Stores a queue's durability in its home's `meta`. The caller checks first that the server
/// can keep it ([`check`]).
pub async fn store<C: ConnectionLike + Send>(con: &mut C, home: &Home, d: &Durability) -> Result<()> {
    d.validate()?;
    let () = redis::cmd("HSET")
        .arg(home.meta())
        .arg("durability")
        .arg(d.mode.as_str())
        .arg("durability_timeout_ms")
        .arg(d.timeout.as_millis() as u64)
        .query_async(con)
        .await?;
    Ok(())
}

/// What a [`confirm`] found.
#[derive(Debug)]
pub struct Confirmed {
    /// The replies of the reads, in order.
    pub reads: Vec<Value>,
    /// The mode's acknowledgements came: what the reads showed is durable. Always true in
    /// mode `none` (nothing is waited for, nothing is sent but the reads).
    pub durable: bool,
    /// What the wait reported, for messages.
    pub acks: String,
}

impl Confirmed {
    /// Read `i`'s reply as a `T`.
    pub fn read<T: redis::FromRedisValue>(&self, i: usize) -> Result<T> {
        let v = self.reads.get(i).cloned().unwrap_or(Value::Nil);
        redis::from_redis_value(v).map_err(|e| Error::Protocol(format!("a confirmation's read {i}: {e}")))
    }
}

/// When this process last warned of a confirmation that timed out (its ms).
static WARNED_MS: AtomicU64 = AtomicU64::new(0);

/// A confirmation of `keys`' slot: `reads` (commands on keys of that slot only), then `HINCRBY
/// durable n 1`, then the mode's wait, as one pipeline on one connection. When the wait reports
/// the mode's acknowledgements, everything the reads showed is durable (see the module's
/// design). A timeout is logged (at most once per 10 s) and marked in the slot's `durable`
/// hash (`since`, the server's time of the first timeout in a row); the next confirmation
/// that succeeds and finds the mark deletes it. In mode `none` only the reads are sent.
pub async fn confirm<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    d: &Durability,
    reads: &Pipeline,
) -> Result<Confirmed> {
    confirm_as(con, keys, d, reads, true).await
}

/// [`confirm`]; a timeout marks the slot only when `mark` (a check before the mode is set
/// leaves no mark).
async fn confirm_as<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    d: &Durability,
    reads: &Pipeline,
    mark: bool,
) -> Result<Confirmed> {
    let n = reads.cmd_iter().count();
    if !d.waits() {
        let reads: Vec<Value> = if n == 0 { Vec::new() } else { reads.query_async(con).await? };
        return Ok(Confirmed { reads, durable: true, acks: String::new() });
    }
    let mut p = reads.clone();
    p.cmd("HGET").arg(keys.durable()).arg("since");
    p.cmd("HINCRBY").arg(keys.durable()).arg("n").arg(1);
    p.add_command(d.wait_cmd());
    let mut all: Vec<Value> = p.query_async(con).await?;
    if all.len() != n + 3 {
        return Err(Error::Protocol(format!("a confirmation of {n} reads had {} replies", all.len())));
    }
    let wait = all.pop().expect("the wait's reply");
    let _counter = all.pop();
    let since = all.pop().expect("the mark's reply");
    let (durable, acks) = d.acknowledged(&wait);
    if durable {
        if since != Value::Nil {
            let _: Result<(), _> = redis::cmd("HDEL").arg(keys.durable()).arg("since").query_async(con).await;
            tracing::info!(slot = keys.tag(), "durability: {} again ({acks})", d.mode.wants());
        }
    } else {
        if mark && since == Value::Nil {
            let now = crate::time::server_now_ms(con, keys).await?;
            let _: bool = redis::cmd("HSETNX").arg(keys.durable()).arg("since").arg(now).query_async(con).await?;
        }
        let now = crate::time::now_ms();
        let last = WARNED_MS.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 10_000
            && WARNED_MS.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(
                slot = keys.tag(),
                "durability {}: {} did not come within {:?} ({acks}); waiting, nothing acts on it meanwhile",
                d.mode.as_str(),
                d.mode.wants(),
                d.timeout
            );
        }
    }
    Ok(Confirmed { reads: all, durable, acks })
}

/// Checks that the server of `keys`' slot keeps `d` now: one confirmation must succeed. The error
/// says what is missing (no replica in sync) and how many replicas the master has.
pub async fn check<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, d: &Durability) -> Result<()> {
    if !d.waits() {
        return Ok(());
    }
    let mut reads = redis::pipe();
    reads.cmd("INFO").arg("replication");
    let confirmed = match confirm_as(con, keys, d, &reads, false).await {
        Ok(s) => s,
        Err(e) => return Err(Error::invalid(format!("durability {} is not possible here: {e}", d.mode.as_str()))),
    };
    if confirmed.durable {
        return Ok(());
    }
    let info: String =
        confirmed.reads.first().and_then(|v| redis::from_redis_value(v.clone()).ok()).unwrap_or_default();
    let replicas = info.lines().find_map(|l| l.strip_prefix("connected_slaves:")).map(str::trim).unwrap_or("?");
    Err(Error::invalid(format!(
        "durability {} needs {}, and none came within {:?} ({}; connected replicas of the master of {}: {replicas})",
        d.mode.as_str(),
        d.mode.wants(),
        d.timeout,
        confirmed.acks,
        keys.tag()
    )))
}

/// When the slot of `keys` last had a confirmation time out with none succeeding since: the
/// server's ms, `None` when it is in sync (or nothing waited).
pub async fn unsynced_since<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Option<u64>> {
    Ok(redis::cmd("HGET").arg(keys.durable()).arg("since").query_async(con).await?)
}

/// A queue's durability as a running process follows it: read again on use once
/// [`FOLLOW_EVERY`] has passed.
pub struct Follow {
    home: Home,
    last: Mutex<(Durability, Option<Instant>)>,
}

impl Follow {
    /// Follows `home`'s durability; the first use reads it.
    pub fn new(home: Home) -> Self {
        Follow { home, last: Mutex::new((Durability::default(), None)) }
    }

    /// The mode now: the last read, or a fresh one when it is older than [`FOLLOW_EVERY`]. A
    /// read that fails keeps the last mode known; with none known yet it is the error (never
    /// taken for `none`).
    pub async fn now<C: ConnectionLike + Send>(&self, con: &mut C) -> Result<Durability> {
        let (d, at) = *self.last.lock().unwrap();
        if at.is_some_and(|t| t.elapsed() < FOLLOW_EVERY) {
            return Ok(d);
        }
        match read(con, &self.home).await {
            Ok(now) => {
                if now != d && at.is_some() {
                    tracing::info!(
                        queue = self.home.queue(),
                        "durability is now {} (was {})",
                        now.mode.as_str(),
                        d.mode.as_str()
                    );
                }
                *self.last.lock().unwrap() = (now, Some(Instant::now()));
                Ok(now)
            }
            Err(e) if at.is_some() => {
                tracing::warn!("reading the queue's durability: {e}");
                Ok(d)
            }
            Err(e) => Err(e),
        }
    }
}

/// What a process's confirmations need: the queue's durability as it follows it, and a connection
/// of their own, opened at first use (so a wait never holds up the process's other commands).
pub struct Waiter {
    follow: Follow,
    con: tokio::sync::Mutex<Option<crate::conn::Conn>>,
}

impl Waiter {
    /// Follows `home`'s durability; nothing is opened yet.
    pub fn new(home: Home) -> Self {
        Waiter { follow: Follow::new(home), con: tokio::sync::Mutex::new(None) }
    }

    /// The queue's durability now (read on `con` at most every [`FOLLOW_EVERY`]), `None` when
    /// it cannot be read and was never read: the caller acts as if it waited (it keeps what it
    /// would otherwise forget).
    pub async fn now(&self, con: &crate::conn::Conn) -> Option<Durability> {
        let mut con = con.clone();
        self.follow.now(&mut con).await.ok()
    }

    /// A [`confirm`] of `keys`' slot on the confirmations' own connection, opened at first use
    /// to `con`'s endpoint (`WAIT` blocks its connection: the process's other commands on `con`
    /// never queue behind it). One at a time: Redis serves a blocked `WAIT` before the next
    /// command of its connection, so confirmations sent together would each wait for those
    /// before (with no replica, past the response timeout). A failed one drops that connection,
    /// and the next opens another: a single server's dedicated connection does not reconnect
    /// by itself.
    pub async fn confirm(
        &self,
        con: &crate::conn::Conn,
        keys: &Keys,
        d: &Durability,
        reads: &Pipeline,
    ) -> Result<Confirmed> {
        let mut held = self.con.lock().await;
        let mut own = match &*held {
            Some(c) => c.clone(),
            None => {
                let c = con.dedicated(TIMEOUT_RANGE.1).await?;
                *held = Some(c.clone());
                c
            }
        };
        let r = confirm(&mut own, keys, d, reads).await;
        if r.is_err() {
            *held = None;
        }
        r
    }
}
