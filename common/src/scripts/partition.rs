//! A partition's ended share of a task, counted in the task's home record (`report.lua`) and
//! then removed from the partition's `unreported` (`ack.lua`): docs/design/partitions.md.

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::home::Home;
use crate::keys::Keys;

use super::registry::*;

/// What a share reports to its home.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareReport {
    /// The task.
    pub task: String,
    /// The home record's incarnation id (`inc`) the share was dispatched for.
    pub home_inc: String,
    /// The partition, 1..=K.
    pub partition: u32,
    /// The home's retry round the share ran in.
    pub round: u64,
    /// The share's final counts.
    pub done: u64,
    /// The share's final counts.
    pub failed: u64,
    /// Its unended shards when it was settled as its home ordered (`lua/stop_share.lua`), or 0.
    pub cancelled: u64,
    /// The first halt a handler of it asked for (`fail_task`), `<task index> <line>`.
    pub asked: Option<String>,
    /// Its first failure, `<task index> <line>`.
    pub first_failure: Option<String>,
}

/// How a report went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// Counted now.
    Counted,
    /// Counted before, or for a round, incarnation or state that no longer takes it.
    Already,
    /// The home record is gone (cleaned): nothing to count.
    HomeGone,
    /// The share ran in a round ahead of the home's: the home lost a reopen its shares kept;
    /// reopen it to that round for this partition (`reopen` with `to_round`), then report again.
    HomeBehind,
}

/// Counts `r` in the home record of `home` (report.lua).
pub async fn report<C: ConnectionLike + Send>(con: &mut C, home: &Home, r: &ShareReport) -> Result<Reported> {
    let code: i64 = scripts()
        .report
        .keyed(home, &KeyArgs { task: Some(&r.task), ..Default::default() })
        .arg(home.prefix())
        .arg(&r.task)
        .arg(&r.home_inc)
        .arg(r.partition)
        .arg(r.round)
        .arg(r.done)
        .arg(r.failed)
        .arg(r.cancelled)
        .arg(r.asked.as_deref().unwrap_or_default())
        .arg(r.first_failure.as_deref().unwrap_or_default())
        .invoke_async(con)
        .await?;
    Ok(match code {
        1 => Reported::Counted,
        2 => Reported::HomeBehind,
        -3 => Reported::HomeGone,
        _ => Reported::Already,
    })
}

/// Removes `task` from `partition`'s `unreported` if it is still the entry that ended at
/// `ended_ms` (ack.lua); true when removed.
pub async fn ack<C: ConnectionLike + Send>(con: &mut C, partition: &Keys, task: &str, ended_ms: u64) -> Result<bool> {
    let r: i64 = scripts().ack.keyed(partition, &KeyArgs::default()).arg(task).arg(ended_ms).invoke_async(con).await?;
    Ok(r == 1)
}

/// Removes the share of `task` in `partition` if its `home_inc` is still `home_inc` (empty: there
/// is no share, and then only keys whose `inc` field is still `keys_inc`) (drop_share.lua); true
/// when removed.
pub async fn drop_share<C: ConnectionLike + Send>(
    con: &mut C,
    partition: &Keys,
    task: &str,
    home_inc: &str,
    keys_inc: &str,
) -> Result<bool> {
    let n: i64 = scripts()
        .drop_share
        .keyed(partition, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(partition.prefix())
        .arg(task)
        .arg(home_inc)
        .arg(keys_inc)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// What a caller asks of a dispatch lease ([`dispatch_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAsk {
    /// The holder extends it (before each share, each chunk of keys).
    Renew,
    /// A caller that would create missing shares takes it (lapsed, or its own).
    Take,
    /// The holder marks the dispatch complete.
    Done,
}

/// How a [`dispatch_lease`] call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Granted, or the dispatch is complete already.
    Granted,
    /// The home is gone or another incarnation.
    Gone,
    /// Another holds it (for a take), or it lapsed or was taken (for a renew or done).
    Refused,
}

/// The dispatch lease of the home record of `task`, incarnation `inc`, for the holder `token`
/// (dispatch_lease.lua; the creator's token is the record's nonce).
pub async fn dispatch_lease<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    task: &str,
    inc: &str,
    ask: LeaseAsk,
    token: &str,
    lease: std::time::Duration,
) -> Result<Lease> {
    let mode = match ask {
        LeaseAsk::Renew => "renew",
        LeaseAsk::Take => "take",
        LeaseAsk::Done => "done",
    };
    let n: i64 = scripts()
        .dispatch_lease
        .keyed(home, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(inc)
        .arg(mode)
        .arg(token)
        .arg(lease.as_millis() as u64)
        .invoke_async(con)
        .await?;
    Ok(match n {
        1 => Lease::Granted,
        0 => Lease::Gone,
        _ => Lease::Refused,
    })
}

/// Ends the share of `task` in `partition` as its home (incarnation `home_inc`) ended, in
/// `state` (end_share.lua); false when it is not that incarnation's or not aggregating.
pub async fn end_share<C: ConnectionLike + Send>(
    con: &mut C,
    partition: &Keys,
    task: &str,
    home_inc: &str,
    state: &str,
) -> Result<bool> {
    let n: i64 = scripts()
        .end_share
        .keyed(partition, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(partition.prefix())
        .arg(task)
        .arg(home_inc)
        .arg(state)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// Reopens the home record of task `id` for a retry of the shares of partitions `parts` (none:
/// those counted with failures, chosen by the script) (reopen.lua); the new round, 0 when there
/// was nothing to forget in a task no longer running (left as it is), or the refusal's code (-3
/// task missing, -9 cancelled, -10 results not kept, -12 layout changed).
///
/// With `to_round`, a repair: a share was reported from that round, ahead of its home's (the
/// home's master lost the reopen); the home takes that round, forgetting `parts`' counts, and
/// a home already at that round or past it is left as it is (0).
pub async fn reopen<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    id: &str,
    to_round: Option<u64>,
    parts: &[u32],
) -> Result<i64> {
    let mut inv = scripts().reopen.keyed(home, &KeyArgs { task: Some(id), ..Default::default() });
    inv.arg(home.prefix()).arg(id).arg(to_round.unwrap_or(0));
    for p in parts {
        inv.arg(*p);
    }
    Ok(inv.invoke_async(con).await?)
}

/// Why `layout.lua` refused a new layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutRefused {
    /// The stored tags are no longer the ones the caller read.
    Changed,
    /// This task runs over partitions.
    TaskRuns(String),
}

/// Sets the layout of `home`'s queue to `k` partitions of tags `tags` (space-separated), with
/// `retired` the partitions no longer in use, if its tags are still `read` (layout.lua); with
/// `check`, only says whether it would.
pub async fn set_layout<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    read: &str,
    k: u32,
    tags: &str,
    retired: &str,
    check: bool,
) -> Result<std::result::Result<(), LayoutRefused>> {
    let reply: Vec<redis::Value> = scripts()
        .layout
        .keyed(home, &KeyArgs::default())
        .arg(home.prefix())
        .arg(read)
        .arg(k)
        .arg(tags)
        .arg(retired)
        .arg(if check { "check" } else { "set" })
        .invoke_async(con)
        .await?;
    let code = match reply.first() {
        Some(redis::Value::Int(c)) => *c,
        _ => return Err(crate::Error::Protocol("layout.lua: no code".into())),
    };
    Ok(match (code, reply.get(1)) {
        (1, _) => Ok(()),
        (-12, _) => Err(LayoutRefused::Changed),
        (-13, Some(redis::Value::BulkString(id))) => Err(LayoutRefused::TaskRuns(String::from_utf8_lossy(id).into())),
        (c, _) => return Err(crate::Error::Protocol(format!("layout.lua returned {c}"))),
    })
}

/// Takes `tag` out of the retired partitions of `home`'s queue once their keys are removed
/// (unretire.lua); true when it was listed.
pub async fn unretire<C: ConnectionLike + Send>(con: &mut C, home: &Home, tag: &str) -> Result<bool> {
    let n: i64 = scripts().unretire.keyed(home, &KeyArgs::default()).arg(tag).invoke_async(con).await?;
    Ok(n == 1)
}

/// Forgets the count of partition `p`'s share of task `id` in its home record, for the
/// aggregation that found the share running again or gone after it was counted (uncount.lua):
/// the task runs again until the share is counted anew. `inc` is the home incarnation id read,
/// `token` the aggregation's claim (only its holder forgets); true when forgotten.
pub async fn uncount<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    id: &str,
    inc: &str,
    p: u32,
    token: &str,
) -> Result<bool> {
    let n: i64 = scripts()
        .uncount
        .keyed(home, &KeyArgs { task: Some(id), ..Default::default() })
        .arg(home.prefix())
        .arg(id)
        .arg(inc)
        .arg(p)
        .arg(token)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// What the home decided on a task over partitions (`decide.lua`, docs/design/failure-policies.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// Halted: it failed fast (past its `max_failures`, or a handler asked).
    Halted,
    /// Settled: it met its `success_when`; its shares are settled next.
    Settled,
    /// Nothing: not running, another incarnation or round, decided before, or no limit crossed.
    Nothing,
}

/// The counts a decision pass read from the shares of one task over partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareSums {
    /// The home record's incarnation id (`inc`) read.
    pub inc: String,
    /// The home's round read.
    pub round: u64,
    /// The shares' `done`, summed.
    pub done: u64,
    /// The `failed` of the shares in `round`, summed.
    pub failed: u64,
    /// The first failure of the lowest partition that has one, `<task index> <line>`.
    pub first_failure: Option<String>,
    /// The first halt a handler asked for, `<task index> <line>`.
    pub asked: Option<String>,
    /// The reason of a share found halted in `round`: its home lost that decision.
    pub halted: Option<String>,
}

/// The home's decision on running task `task` over partitions from its shares' counts `sums`
/// (`decide.lua`).
pub async fn decide<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    task: &str,
    sums: &ShareSums,
) -> Result<Decided> {
    let code: i64 = scripts()
        .decide
        .keyed(home, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(home.prefix())
        .arg(task)
        .arg(&sums.inc)
        .arg(sums.round)
        .arg(sums.done)
        .arg(sums.failed)
        .arg(sums.first_failure.as_deref().unwrap_or_default())
        .arg(sums.asked.as_deref().unwrap_or_default())
        .arg(sums.halted.as_deref().unwrap_or_default())
        .invoke_async(con)
        .await?;
    Ok(match code {
        1 => Decided::Halted,
        2 => Decided::Settled,
        _ => Decided::Nothing,
    })
}

/// How a share is stopped as its home decided (`stop_share.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareStop<'a> {
    /// The home halted, for this reason.
    Halt(&'a str),
    /// The home settled.
    Settle,
}

/// Stops the share of `task` in `partition` as its home (incarnation `home_inc`, in round
/// `round`) decided (`stop_share.lua`); how many of its held refs were stopped, `None` when it
/// was not stopped (another incarnation, a newer round, or not running).
pub async fn stop_share<C: ConnectionLike + Send>(
    con: &mut C,
    partition: &Keys,
    task: &str,
    home_inc: &str,
    round: u64,
    how: &ShareStop<'_>,
) -> Result<Option<u64>> {
    let (mode, why) = match how {
        ShareStop::Halt(why) => ("halt", *why),
        ShareStop::Settle => ("settle", ""),
    };
    let n: i64 = scripts()
        .stop_share
        .keyed(partition, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(partition.prefix())
        .arg(task)
        .arg(home_inc)
        .arg(round)
        .arg(mode)
        .arg(why)
        .invoke_async(con)
        .await?;
    Ok((n >= 0).then_some(n as u64))
}
