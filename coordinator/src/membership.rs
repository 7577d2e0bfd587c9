//! Executor membership: each executor registers its node id (host, pid, concurrency, version)
//! and refreshes a heartbeat; a node whose heartbeat is older than the member timeout is gone.
//! A second executor with a live node id is refused. The loop here also runs the rebalancer
//! after every heartbeat, so failover needs no separate process.

use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::scripts::{self, NodeHolder};
use shardctl_common::time::server_now_ms;
use shardctl_common::{Error, Home, Result, ScriptCode};
use tokio_util::sync::CancellationToken;

use crate::rebalance::{self, RebalanceReport};

/// Default membership heartbeat period.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// Default timeout: three missed heartbeats.
pub const DEFAULT_MEMBER_TIMEOUT: Duration = Duration::from_secs(15);

/// What an executor says of itself at every heartbeat (fields named `live_*`: its counts, its
/// longest running shards; docs/design/dashboard.md, "Executors").
#[derive(Clone)]
pub struct LiveFields(pub std::sync::Arc<dyn Fn() -> Vec<(&'static str, String)> + Send + Sync>);

impl std::fmt::Debug for LiveFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveFields")
    }
}

/// One executor's identity in the membership.
#[derive(Debug, Clone)]
pub struct Member {
    /// The node id (the unit of routing).
    pub node: String,
    /// Unique per process: tells a restart from a second process with the same id.
    pub instance: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Shards run at once.
    pub concurrency: usize,
    /// The kinds it serves, comma-separated (`*`: every kind; see `Registry::served_kinds`).
    pub kinds: String,
    /// What it says of itself at every heartbeat, if anything.
    pub live: Option<LiveFields>,
}

impl Member {
    /// The node id becomes part of keys (`node:<n>`, `node:<n>:wait`), the instance a member of
    /// `leases` and of tokens: each must follow its rule in [`shardctl_common::names`].
    pub fn validate(&self) -> Result<()> {
        shardctl_common::names::validate_node_id(&self.node)?;
        shardctl_common::names::validate_instance(&self.instance)
    }
}

/// Timings of the membership loop.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// A heartbeat older than this is a departed node.
    pub timeout: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig { heartbeat: DEFAULT_HEARTBEAT, timeout: DEFAULT_MEMBER_TIMEOUT }
    }
}

impl MembershipConfig {
    /// The timeout must outlast a few heartbeats.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.heartbeat < Duration::from_millis(10) || self.timeout <= self.heartbeat {
            return Err(format!(
                "member timeout ({:?}) must be above the membership heartbeat ({:?}, at least 10ms)",
                self.timeout, self.heartbeat
            ));
        }
        Ok(())
    }
}

fn fields(m: &Member) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("host", m.host.clone()),
        ("pid", m.pid.to_string()),
        ("concurrency", m.concurrency.to_string()),
        ("kinds", m.kinds.clone()),
        ("version", env!("CARGO_PKG_VERSION").to_owned()),
    ];
    if m.pid == std::process::id() {
        if let Some(p) = crate::liveness::own_identity() {
            f.push(("proc", p.to_owned()));
        }
    }
    if let Some(live) = &m.live {
        f.extend((live.0)().into_iter().filter(|(k, _)| k.starts_with("live_")));
    }
    f
}

fn in_use(node: &str, h: &NodeHolder) -> Error {
    Error::refused(
        ScriptCode::NodeAlive,
        format!(
            "node id '{node}' is held by a live executor (pid {} on {}, heartbeat {} ms ago); if that \
             executor is gone, the id frees in {:.1} s; else pick another node id or stop that one",
            h.pid,
            h.host,
            h.age_ms,
            h.left_ms as f64 / 1000.0
        ),
    )
}

/// Registers `m`, refused while another live executor holds its node id. A holder that is
/// provably dead (see [`crate::liveness::provably_dead`]: a restart after a crash on the same
/// host) gives the id up at once.
pub async fn join(con: &mut Conn, home: &Home, m: &Member, cfg: &MembershipConfig) -> Result<()> {
    m.validate()?;
    let timeout = cfg.timeout.as_millis() as u64;
    let f = fields(m);
    let h = match scripts::join(con, home, &m.node, &m.instance, timeout, None, &f).await? {
        Ok(()) => return Ok(()),
        Err(h) => h,
    };
    if !crate::liveness::provably_dead(&h.host, &h.pid, &h.proc, &m.host) {
        return Err(in_use(&m.node, &h));
    }
    match scripts::join(con, home, &m.node, &m.instance, timeout, Some(&h.instance), &f).await? {
        Ok(()) => {
            tracing::warn!(
                "node id '{}' taken over from its dead predecessor (pid {} on {}, heartbeat {} ms ago)",
                m.node,
                h.pid,
                h.host,
                h.age_ms
            );
            Ok(())
        }
        // another process took it over meanwhile
        Err(h) => Err(in_use(&m.node, &h)),
    }
}

/// Leaves the membership (graceful shutdown).
pub async fn leave(con: &mut Conn, home: &Home, m: &Member) -> Result<bool> {
    m.validate()?;
    scripts::leave(con, home, &m.node, &m.instance).await
}

/// The live node ids, sorted: those whose last heartbeat is within their own member timeout, by
/// the Redis server's clock (the one `join.lua` scored them with).
pub async fn live<C: redis::aio::ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Vec<String>> {
    let now = server_now_ms(con, home).await?;
    let mut v: Vec<String> =
        redis::cmd("ZRANGEBYSCORE").arg(home.nodes()).arg(format!("({now}")).arg("+inf").query_async(con).await?;
    v.sort();
    Ok(v)
}

/// The kinds the live executors serve; `None` when nothing can be said (no executor is live,
/// or one serves every kind, or one joined without announcing its kinds).
pub async fn served_kinds<C: redis::aio::ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
) -> Result<Option<std::collections::BTreeSet<String>>> {
    let live = live(con, home).await?;
    if live.is_empty() {
        return Ok(None);
    }
    let mut served = std::collections::BTreeSet::new();
    for n in &live {
        let kinds: Option<String> = redis::cmd("HGET").arg(home.node(n)).arg("kinds").query_async(con).await?;
        let Some(kinds) = kinds else { return Ok(None) };
        for k in kinds.split(',').filter(|k| !k.is_empty()) {
            if k == "*" {
                return Ok(None);
            }
            served.insert(k.to_owned());
        }
    }
    Ok(Some(served))
}

/// `None` while a live executor may serve `kind` (or nothing can be said: see [`served_kinds`]),
/// else what to say: "no live executor serves kind 'prime'; served: primes, report".
pub async fn unserved<C: redis::aio::ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    kind: &str,
) -> Result<Option<String>> {
    let Some(served) = served_kinds(con, home).await? else { return Ok(None) };
    if served.contains(kind) {
        return Ok(None);
    }
    let list = served.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
    Ok(Some(format!("no live executor serves kind '{kind}'; served: {list}")))
}

/// Refreshes the heartbeat every `cfg.heartbeat` and rebalances after each, until `stop`; a
/// notification of `wake` rebalances at once (routed work is waiting), trying again shortly
/// while another process holds the rebalance lock (it may have passed the waiting work by).
/// Returns an error when another executor took the node id over (this one must stop).
pub async fn run(
    mut con: Conn,
    home: Home,
    m: Member,
    cfg: MembershipConfig,
    stop: CancellationToken,
    wake: std::sync::Arc<tokio::sync::Notify>,
    on_rebalance: impl Fn(&RebalanceReport) + Send,
) -> Result<()> {
    let mut next_beat = tokio::time::Instant::now();
    // rebalances still owed to a wake-up that found the lock taken
    let mut owed = 0u32;
    loop {
        let now = tokio::time::Instant::now();
        if now >= next_beat {
            // from now, not from the missed beat: a pause or a slow call leaves no burst behind
            next_beat = now + cfg.heartbeat;
            match join(&mut con, &home, &m, &cfg).await {
                Ok(()) => {}
                Err(e @ Error::Refused { code: ScriptCode::NodeAlive, .. }) => return Err(e),
                Err(e) => tracing::warn!("membership heartbeat failed: {e}"),
            }
        }
        match rebalance::rebalance(&mut con, &home).await {
            Ok(Some(r)) => {
                owed = 0;
                if r.changed() {
                    r.log();
                    on_rebalance(&r);
                }
            }
            Ok(None) => owed = owed.saturating_sub(1),
            Err(e) => tracing::warn!("rebalance failed: {e}"),
        }
        let until = if owed > 0 { next_beat.min(tokio::time::Instant::now() + WAKE_RETRY) } else { next_beat };
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = wake.notified() => owed = WAKE_RETRIES,
            _ = stop.cancelled() => return Ok(()),
        }
    }
}

/// After a wake-up, how often and how long apart a rebalance is tried while the lock is taken.
const WAKE_RETRIES: u32 = 20;
const WAKE_RETRY: Duration = Duration::from_millis(100);
