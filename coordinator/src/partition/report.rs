//! The report of each ended share to its home, repeated until acknowledged, and the end of
//! the shares of an ended task. When the queue's durability asks (docs/design/durability.md),
//! a share's entry is acknowledged only once a confirmation shows the home's count of it on a
//! replica: a count a failover took is reported again, never left to the reconciliation.

use redis::aio::ConnectionLike;
use shardctl_common::conn::Conn;
use shardctl_common::durability::{self, Waiter};
use shardctl_common::partition::Layout;
use shardctl_common::scripts::{self, Reported, ShareReport};
use shardctl_common::{Home, Keys, Result};

/// Where the confirmations of the home's counts are made.
pub(super) enum Confirm<'a> {
    /// On the reporting connection itself (a caller with a connection of its own).
    OnCon,
    /// On the waiter's own connection to `Conn`'s endpoint (the upkeep, whose connection the
    /// process shares: a `WAIT` must not hold its other commands up).
    Own(&'a Waiter, &'a Conn),
}

/// Shares read from a partition's `unreported` per call.
const REPORT_BATCH: usize = 100;

/// The first [`REPORT_BATCH`] entries of `keys`' `unreported` (task → end ms): a partition's
/// ended shares to report, or the home's ended tasks whose shares to end.
async fn unreported_page<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Vec<(String, u64)>> {
    Ok(redis::cmd("ZRANGE")
        .arg(keys.unreported())
        .arg(0)
        .arg(REPORT_BATCH as i64 - 1)
        .arg("WITHSCORES")
        .query_async(con)
        .await?)
}

/// Reports every ended share found in the partitions' `unreported` to the home, then
/// acknowledges it there. Idempotent: whoever repeats it counts nothing twice. Returns how many
/// shares were counted now.
pub async fn report_pending<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<u64> {
    report_all(con, layout, &Confirm::OnCon).await
}

/// [`report_pending`], its confirmations made as `how` says.
pub(super) async fn report_all<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    how: &Confirm<'_>,
) -> Result<u64> {
    // (a partition unreachable now must not hold the reports of the others)
    if let Err(e) = end_pending(con, layout).await {
        tracing::warn!("ending the shares of ended tasks: {e}");
    }
    let d = match how {
        Confirm::OnCon => durability::read(con, &layout.home).await?,
        Confirm::Own(w, c) => w
            .now(c)
            .await
            .ok_or_else(|| shardctl_common::Error::Protocol("the queue's durability could not be read".into()))?,
    };
    let mut counted = 0;
    for pk in &layout.partitions {
        let mut reported = Vec::new();
        for (task, ended) in unreported_page(con, pk).await? {
            let r = report_share(con, &layout.home, pk, &task, ended).await?;
            counted += u64::from(r.counted);
            match r.share {
                Some(share) if d.waits() => reported.push((task, ended, share)),
                _ => {
                    scripts::ack(con, pk, &task, ended).await?;
                }
            }
        }
        if reported.is_empty() {
            continue;
        }
        // one confirmation of the home for the page: what it shows decides each entry
        let mut reads = redis::pipe();
        for (task, _, s) in &reported {
            let (part, round) = (format!("part:{}", s.partition), format!("round:{}", s.partition));
            reads.cmd("HMGET").arg(layout.home.task(task)).arg(&["inc", "seq", "round", "state", "partitions"]);
            reads.cmd("HMGET").arg(layout.home.task(task)).arg(&[part, round]);
        }
        let confirmed = match how {
            Confirm::OnCon => durability::confirm(con, layout.home.keys(), &d, &reads).await?,
            Confirm::Own(w, c) => w.confirm(c, layout.home.keys(), &d, &reads).await?,
        };
        if !confirmed.durable {
            // the entries stay: reported again next round (a report counts once)
            continue;
        }
        for (i, (task, ended, share)) in reported.iter().enumerate() {
            let home: HomeRow = confirmed.read(2 * i)?;
            let count: (Option<String>, Option<u64>) = confirmed.read(2 * i + 1)?;
            if nothing_to_report(share, home, count) {
                scripts::ack(con, pk, task, *ended).await?;
            } else {
                tracing::warn!(
                    task,
                    partition = share.partition,
                    "the home lost a share's count (a failover): reported again"
                );
            }
        }
    }
    Ok(counted)
}

/// The home record's `inc`, `seq`, `round`, `state` and `partitions`, as a confirmation reads them.
type HomeRow = (Option<String>, Option<String>, Option<u64>, Option<String>, Option<u32>);

/// A share's report as the home's count of it is checked.
pub(super) struct Share {
    home_inc: String,
    partition: u32,
    round: u64,
}

/// Whether the home, as a confirmation read it (`inc`, `seq`, `round`, `state`, `partitions`;
/// then `part:<p>`, `round:<p>`), takes no report of `share`: the same conditions as
/// `lua/report.lua`, so that an entry is acknowledged only when reporting it again would change
/// nothing. A home whose count of the share was lost would count it again: not acknowledged.
fn nothing_to_report(
    share: &Share,
    (inc, seq, round, state, partitions): HomeRow,
    (part, part_round): (Option<String>, Option<u64>),
) -> bool {
    let Some(seq) = seq else { return true };
    let state = state.as_deref();
    if inc.unwrap_or(seq) != share.home_inc || partitions.is_none() || state == Some("cancelled") {
        return true;
    }
    let round = round.unwrap_or(0);
    if share.round > round {
        return false;
    }
    if round != share.round || !matches!(state, Some("running" | "delayed")) {
        return true;
    }
    part.is_some() && part_round.is_none_or(|r| r >= share.round)
}

/// Ends the shares of every task found in the home's `unreported` (tasks over partitions whose
/// aggregation was recorded: `finish_task` lists them) as their home ended, dropping their
/// results unless the task keeps them (`end_share.lua`), or, of a halted task (`decide.lua`
/// lists it), stops them (`stop_share.lua`), then takes the entry out if it is still the one
/// read (`ack.lua`). A home gone, retried or of another layout only loses its
/// entry. Idempotent: whoever repeats it ends nothing twice.
async fn end_pending<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<()> {
    let home = &layout.home;
    for (task, ended) in unreported_page(con, home).await? {
        let tl = shardctl_common::partition::task_layout(con, home, &task).await?;
        let (state, halted, round): (Option<String>, Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(home.task(&task)).arg(&["state", "halted", "round"]).query_async(con).await?;
        let inc = shardctl_common::share::home_inc_of(con, home, &task).await?;
        match (state.as_deref(), inc, halted) {
            // halted (docs/design/failure-policies.md): its shares still running stop
            (Some("failed"), Some(inc), Some(why)) => {
                let how = scripts::ShareStop::Halt(&why);
                for pk in &tl.partitions {
                    scripts::stop_share(con, pk, &task, &inc, round.unwrap_or(0), &how).await?;
                }
            }
            (Some(state @ ("completed" | "failed")), Some(inc), None) => {
                for pk in &tl.partitions {
                    scripts::end_share(con, pk, &task, &inc, state).await?;
                }
            }
            _ => {}
        }
        scripts::ack(con, home, &task, ended).await?;
    }
    Ok(())
}

/// What [`report_share`] did.
pub(super) struct ShareReported {
    /// The home counted it now.
    pub(super) counted: bool,
    /// The share's report, when one was made (the share ended, in an incarnation).
    share: Option<Share>,
}

/// Reports one ended share (its entry is left for the caller to acknowledge).
pub(super) async fn report_share<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    share_keys: &Keys,
    task: &str,
    ended: u64,
) -> Result<ShareReported> {
    let row: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(share_keys.task(task))
        .arg(&[
            "part",
            "round",
            "done",
            "failed",
            "state",
            "cancelled",
            "base",
            "halt_asked",
            "first_failure",
            "halted",
        ])
        .query_async(con)
        .await?;
    let num = |i: usize| row[i].as_deref().and_then(|v| v.parse::<u64>().ok());
    let (p, round, done, failed, state) = (num(0).map(|p| p as u32), num(1), num(2), num(3), row[4].as_deref());
    let base = num(6).unwrap_or(0);
    let home_inc = shardctl_common::share::share_inc(con, share_keys, task).await?;
    // a share halted as its home ordered is never counted (its unfinished shards would be lost
    // to the count); a home that lost the halt decides it again from it (`decide_pass`)
    let halted = row[9].is_some();
    let mut share = None;
    let counted = match (p, home_inc, round, done, failed, shardctl_common::share::ended(state) && !halted) {
        (Some(partition), Some(home_inc), Some(round), Some(done), Some(failed), true) => {
            let at = |v: &Option<String>| v.as_deref().map(|v| shardctl_common::share::at_task_index(base, v));
            share = Some(Share { home_inc: home_inc.clone(), partition, round });
            let r = ShareReport {
                task: task.to_owned(),
                home_inc,
                partition,
                round,
                done,
                failed,
                cancelled: num(5).unwrap_or(0),
                asked: at(&row[7]),
                first_failure: at(&row[8]),
            };
            match scripts::report(con, home, &r).await? {
                Reported::Counted => true,
                // the home's master lost a retry its shares kept: the home is reopened to the
                // share's round for this partition, then counts it
                Reported::HomeBehind => {
                    let code = scripts::reopen(con, home, task, Some(round), &[partition]).await?;
                    tracing::warn!(
                        task,
                        partition,
                        round,
                        code,
                        "the home had lost a retry: reopened to its share's round"
                    );
                    scripts::report(con, home, &r).await? == Reported::Counted
                }
                _ => false,
            }
        }
        // the share is gone (cleaned, expired) or runs again: nothing to count for this entry
        _ => false,
    };
    if counted {
        tracing::debug!(task, partition = p.unwrap_or(0), ended, "share counted in the home");
    }
    Ok(ShareReported { counted, share })
}

/// Creates share `p` of running task `id` again if it is missing and its dispatch is over: the
/// reconciliation takes the task's dispatch lease (`token`), which must have lapsed (its
/// dispatcher died or stalled) or be complete (the share's creation was lost with a
/// partition's master since). It is created in the home's round. A keyed share keeps the keys
/// its incarnation left complete; when they are not (a dispatch cut short while writing them,
/// or lost), the task cannot run as dispatched: it is cancelled, saying so. Returns whether
/// the lease was taken.
pub(super) async fn recreate_share<C: ConnectionLike + Send>(
    con: &mut C,
    layout: &Layout,
    id: &str,
    p: u32,
    token: &str,
) -> Result<bool> {
    let t = crate::progress::task(con, &layout.home, id).await?;
    let (_, size) = shardctl_common::partition::share_range(p, t.partitions, t.total);
    if size == 0 || t.partitions != layout.count() {
        return Ok(false);
    }
    let lease = shardctl_common::incarnation::DISPATCH_LEASE;
    match scripts::dispatch_lease(con, &layout.home, id, &t.inc, scripts::LeaseAsk::Take, token, lease).await? {
        scripts::Lease::Granted => {}
        // its dispatcher is still creating it, or the task is gone
        _ => return Ok(false),
    }
    let pk = layout.partition(p)?;
    if t.has_keys && !shardctl_common::partition::share_keys_complete(con, pk, id, &t.inc, size).await? {
        tracing::warn!(task = %id, partition = p, "a share's keys are lost (its dispatch was cut short, or a failover lost them): the task is cancelled; dispatch it again");
        if let Err(e) = shardctl_common::control::cancel(con, &layout.home, id).await {
            tracing::warn!(task = %id, "cancelling a task whose keys are lost: {e}");
        }
        return Ok(true);
    }
    let (priority, round): (Option<i64>, Option<u64>) =
        redis::cmd("HMGET").arg(layout.home.task(id)).arg("priority").arg("round").query_async(con).await?;
    tracing::warn!(task = %id, partition = p, "a share of a running task is missing: creating it again");
    let spec = shardctl_common::partition::spec_of(&t, priority.unwrap_or(0));
    shardctl_common::partition::create_share_keyed(
        con,
        &layout.home,
        pk,
        p,
        t.partitions,
        &spec,
        &t.inc,
        None,
        round.unwrap_or(0),
        Some(token),
    )
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::{nothing_to_report, HomeRow, Share};

    fn share() -> Share {
        Share { home_inc: "3.ab".into(), partition: 2, round: 1 }
    }

    fn home(inc: &str, round: u64, state: &str) -> HomeRow {
        (Some(inc.into()), Some("3".into()), Some(round), Some(state.into()), Some(3))
    }

    /// The mirror of lua/report.lua: an entry is acknowledged only when reporting it again would
    /// count nothing; a count the home lost (same incarnation, round and a running home, no
    /// `part:<p>`) would count again, and is not.
    #[test]
    fn an_entry_is_acknowledged_only_when_a_report_would_count_nothing() {
        let s = share();
        let counted = (Some("4/0".to_owned()), Some(1));
        let none = (None, None);
        assert!(nothing_to_report(&s, home("3.ab", 1, "running"), counted.clone()), "counted this round");
        assert!(!nothing_to_report(&s, home("3.ab", 1, "running"), none.clone()), "the count lost: report again");
        assert!(!nothing_to_report(&s, home("3.ab", 1, "delayed"), none.clone()), "a delayed home counts too");
        assert!(!nothing_to_report(&s, home("3.ab", 0, "running"), counted.clone()), "the home a round behind");
        assert!(!nothing_to_report(&s, home("3.ab", 1, "running"), (Some("4/0".into()), Some(0))), "an older count");
        assert!(nothing_to_report(&s, (None, None, None, None, None), none.clone()), "the home gone");
        assert!(nothing_to_report(&s, home("4.cd", 1, "running"), none.clone()), "another incarnation");
        assert!(nothing_to_report(&s, home("3.ab", 1, "cancelled"), none.clone()), "cancelled");
        assert!(nothing_to_report(&s, home("3.ab", 2, "running"), none.clone()), "an older round of the share");
        assert!(nothing_to_report(&s, home("3.ab", 1, "completed"), none.clone()), "ended");
        let (inc, seq, round, state, _) = home("3.ab", 1, "running");
        assert!(nothing_to_report(&s, (inc, seq, round, state, None), none), "not over partitions");
    }
}
