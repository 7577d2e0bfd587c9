//! The confirmations of what a dispatcher and a waiter promise (`docs/design/durability.md`): a
//! dispatch's records reached what the queue's durability asks before its id is given out, and
//! a task's end did before `wait` returns it; and the durability `status` shows. Mode `none`
//! sends nothing but the read of the mode.

use std::time::Duration;

use redis::aio::ConnectionLike;
use shardctl_common::conn::Conn;
use shardctl_common::durability::{self, Confirmed, Durability, Waiter};
use shardctl_common::{Error, Home, Keys, Result};

/// Pause between confirmations whose wait timed out (each waited the queue's timeout already).
const AGAIN: Duration = Duration::from_millis(100);
/// How long Redis errors (a failover under way) are retried before a dispatch's confirmation
/// gives up.
const ERRORS_FOR: Duration = Duration::from_secs(60);

/// One confirmation of `keys`' slot with `reads`, repeated while its wait times out, and while
/// Redis fails with a retryable error for up to [`ERRORS_FOR`] (a failover: the cluster
/// connection finds the new master); the confirmation once durable. The queue's mode is read
/// again before each: a change to `none` ends the wait (the reads are then made alone).
async fn confirmed(waiter: &Waiter, con: &Conn, keys: &Keys, reads: &redis::Pipeline) -> Result<Confirmed> {
    let mut failing: Option<std::time::Instant> = None;
    loop {
        // (a mode that cannot be read keeps the wait)
        let d = waiter.now(con).await.unwrap_or(Durability { mode: durability::Mode::Replica, ..Default::default() });
        match waiter.confirm(con, keys, &d, reads).await {
            Ok(s) if s.durable => return Ok(s),
            Ok(_) => failing = None,
            Err(e) if e.is_retryable() && failing.is_none_or(|t| t.elapsed() < ERRORS_FOR) => {
                failing.get_or_insert_with(std::time::Instant::now);
                tracing::warn!("confirming {}: {e} (retrying)", keys.tag());
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(AGAIN).await;
    }
}

/// What a dispatch's confirmation compares the record with, read just before the dispatch
/// wrote it: the server's time, and the incarnation the id had then (a dispatch that resumes
/// it keeps it). A record of another incarnation created before that time is one a failover
/// restored.
pub struct Since {
    at: u64,
    existing: Option<String>,
}

/// [`Since`], read when the queue's durability waits (`None` with `none`).
pub async fn before_dispatch(con: &mut Conn, home: &Home, id: &str) -> Result<Option<Since>> {
    if !durability::read(con, home).await?.waits() {
        return Ok(None);
    }
    let at = shardctl_common::time::server_now_ms(con, home.keys()).await?;
    let existing = shardctl_common::share::home_inc_of(con, home, id).await?;
    Ok(Some(Since { at, existing }))
}

/// Returns once task `id`'s dispatch is durable: a confirmation of its home record shows it
/// made (or resumed) by this dispatch ([`Since`]). A record
/// missing, or an older incarnation in its place (a failover between the write and now), is
/// [`Error::Lost`]: the task this dispatch made does not exist. Each share is confirmed too; one
/// missing is not an error (the home is durable, and the reconciliation creates a share its
/// running task lacks), only said. The waits run on a connection of their own, never on `con`.
/// `since` is what [`before_dispatch`] read: `None` in mode `none`, where nothing is waited for
/// (the mode is read once per dispatch, there).
pub async fn dispatch(con: &mut Conn, home: &Home, id: &str, since: Option<Since>) -> Result<()> {
    let Some(since) = since else { return Ok(()) };
    let waiter = Waiter::new(home.clone());
    let mut reads = redis::pipe();
    reads.cmd("HMGET").arg(home.task(id)).arg(&["inc", "seq", "state", "created_ms"]);
    let r = confirmed(&waiter, con, home.keys(), &reads).await?;
    let (inc, seq, state, created): (Option<String>, Option<u64>, Option<String>, Option<u64>) = r.read(0)?;
    let Some(inc) = shardctl_common::incarnation::of_fields(inc.as_deref(), seq) else {
        return Err(lost(id, "its record was lost"));
    };
    if let Some(created) = created {
        if since.existing.as_deref() != Some(inc.as_str()) && created < since.at {
            return Err(lost(id, "its record was lost, and an earlier task under its id is back in its place"));
        }
    }
    // a share of a task that ended already may be gone with its results: nothing to lose
    if matches!(state.as_deref(), Some("completed" | "failed" | "cancelled")) {
        return Ok(());
    }
    let layout = shardctl_common::partition::task_layout(con, home, id).await?;
    for pk in &layout.partitions {
        let mut reads = redis::pipe();
        reads.cmd("HMGET").arg(pk.task(id)).arg(&["home_inc", "home_seq"]);
        let r = confirmed(&waiter, con, pk, &reads).await?;
        let (share_inc, share_seq): (Option<String>, Option<u64>) = r.read(0)?;
        if shardctl_common::incarnation::of_fields(share_inc.as_deref(), share_seq).as_deref() != Some(inc.as_str()) {
            tracing::warn!(
                task = id,
                partition = pk.tag(),
                "a share of the task was lost before it reached a replica: the reconciliation creates it again"
            );
        }
    }
    Ok(())
}

fn lost(id: &str, what: &str) -> Error {
    Error::Lost(format!(
        "task '{id}': {what} before it reached a replica (a failover of its master): the task \
         this dispatch made does not exist (shards of it already handed out are dropped); dispatch it again"
    ))
}

/// Whether task `id`'s end (`state`, seen by a read just before) is durable: a confirmation of its
/// home reads the same state. `false` while the wait times out, or when the end was lost (the
/// caller waits on).
pub async fn ended<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str, state: &str) -> Result<bool> {
    let d = match durability::read(con, home).await {
        Ok(d) => d,
        Err(e) if e.is_retryable() => return Ok(false),
        Err(e) => return Err(e),
    };
    if !d.waits() {
        return Ok(true);
    }
    let mut reads = redis::pipe();
    reads.cmd("HGET").arg(home.task(id)).arg("state");
    let s = match durability::confirm(con, home.keys(), &d, &reads).await {
        Ok(s) => s,
        // (the waiter reads again: a failover under way)
        Err(e) if e.is_retryable() => return Ok(false),
        Err(e) => return Err(e),
    };
    let now: Option<String> = s.read(0)?;
    Ok(s.durable && now.as_deref() == Some(state))
}

/// A queue's durability as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// The mode's name.
    pub mode: &'static str,
    /// One wait's timeout, ms.
    pub timeout_ms: u64,
    /// Every slot of the queue had a replica acknowledge a probe just now; `None` in mode
    /// `none`, or when the probes could not be made (`error`).
    pub in_sync: Option<bool>,
    /// How long the confirmations of a slot whose probe failed now have timed out, none
    /// succeeding since (the longest such slot); `None` when none had timed out before.
    pub unsynced_for_ms: Option<u64>,
    /// The hash tag of a slot whose probe failed now (the one out of sync longest).
    pub unsynced_slot: Option<String>,
    /// Why the probes could not be made (a user without write access, say).
    pub error: Option<String>,
}

/// How long a probe of `status` waits for a replica: one in sync answers within a round trip.
const PROBE_WAIT: Duration = Duration::from_millis(250);

/// The queue's durability, and whether it is kept now: each slot of the queue (its home and
/// partitions) is probed with a confirmation, which marks a slot out of sync or clears its
/// mark; a slot whose probe fails is reported with how long its mark says it has been so (read
/// before the probe). A probe that cannot be made is said, not an error of `status`.
pub async fn status<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Status> {
    let d = durability::read(con, home).await?;
    let mut st = Status {
        mode: d.mode.as_str(),
        timeout_ms: d.timeout.as_millis() as u64,
        in_sync: None,
        unsynced_for_ms: None,
        unsynced_slot: None,
        error: None,
    };
    if !d.waits() {
        return Ok(st);
    }
    let layout = shardctl_common::partition::layout(con, home).await?;
    let probe = Durability { timeout: PROBE_WAIT.min(d.timeout), ..d };
    let mut in_sync = true;
    for keys in [home.keys()].into_iter().chain(layout.partitions.iter()) {
        let checked = async {
            let since = durability::unsynced_since(con, keys).await?;
            let now = shardctl_common::time::server_now_ms(con, keys).await?;
            let p = durability::confirm(con, keys, &probe, &redis::pipe()).await?;
            Ok::<_, Error>((p.durable, since.map(|s| now.saturating_sub(s))))
        };
        match checked.await {
            Ok((true, _)) => {}
            Ok((false, age)) => {
                in_sync = false;
                if st.unsynced_slot.is_none() || age > st.unsynced_for_ms {
                    st.unsynced_for_ms = age;
                    st.unsynced_slot = Some(keys.tag().to_owned());
                }
            }
            Err(e) => {
                st.error = Some(format!("probing {}: {e}", keys.tag()));
                return Ok(st);
            }
        }
    }
    st.in_sync = Some(in_sync);
    Ok(st)
}
