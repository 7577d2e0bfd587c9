//! A partition's ended share of a task, counted in the task's home record (`report.lua`) and
//! then removed from the partition's `unreported` (`ack.lua`): ARCHITECTURE.md, "Partitioned
//! queues".

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::keys::Keys;

use super::*;

/// What a share reports to its home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareReport {
    /// The task.
    pub task: String,
    /// The home record's incarnation the share was dispatched for.
    pub home_seq: u64,
    /// The partition, 1..=K.
    pub part: u32,
    /// The home's retry round the share ran in.
    pub round: u64,
    /// The share's final counts.
    pub done: u64,
    /// The share's final counts.
    pub failed: u64,
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
}

/// Counts `r` in the home record of `home` (report.lua).
pub async fn report<C: ConnectionLike + Send>(con: &mut C, home: &Keys, r: &ShareReport) -> Result<Reported> {
    let code: i64 = scripts()
        .report
        .keyed(home, &KeyArgs { task: Some(&r.task), ..Default::default() })
        .arg(home.prefix())
        .arg(&r.task)
        .arg(r.home_seq)
        .arg(r.part)
        .arg(r.round)
        .arg(r.done)
        .arg(r.failed)
        .invoke_async(con)
        .await?;
    Ok(match code {
        1 => Reported::Counted,
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

/// Removes the share of `task` in `partition` if its `home_seq` is still `home_seq` (empty: it
/// had none) (drop_share.lua); true when removed.
pub async fn drop_share<C: ConnectionLike + Send>(
    con: &mut C,
    partition: &Keys,
    task: &str,
    home_seq: &str,
) -> Result<bool> {
    let n: i64 = scripts()
        .drop_share
        .keyed(partition, &KeyArgs { task: Some(task), ..Default::default() })
        .arg(partition.prefix())
        .arg(task)
        .arg(home_seq)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}

/// Reopens the home record of task `id` for a retry of the shares of partitions `parts` (none:
/// those counted with failures, chosen by the script) (reopen.lua); the new round, 0 when there
/// was nothing to forget in a task no longer running (left as it is), or the refusal's code (-3
/// task missing, -9 cancelled, -10 results not kept, -12 layout changed).
pub async fn reopen<C: ConnectionLike + Send>(con: &mut C, home: &Keys, id: &str, parts: &[u32]) -> Result<i64> {
    let mut inv = scripts().reopen.keyed(home, &KeyArgs { task: Some(id), ..Default::default() });
    inv.arg(home.prefix()).arg(id);
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
    home: &Keys,
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
pub async fn unretire<C: ConnectionLike + Send>(con: &mut C, home: &Keys, tag: &str) -> Result<bool> {
    let n: i64 = scripts().unretire.keyed(home, &KeyArgs::default()).arg(tag).invoke_async(con).await?;
    Ok(n == 1)
}

/// Forgets the count of partition `p`'s share of task `id` in its home record, for the
/// aggregation that found the share running again or gone after it was counted (uncount.lua):
/// the task runs again until the share is counted anew. `seq` is the home incarnation read,
/// `token` the aggregation's claim (only its holder forgets); true when forgotten.
pub async fn uncount<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Keys,
    id: &str,
    seq: u64,
    p: u32,
    token: &str,
) -> Result<bool> {
    let n: i64 = scripts()
        .uncount
        .keyed(home, &KeyArgs { task: Some(id), ..Default::default() })
        .arg(home.prefix())
        .arg(id)
        .arg(seq)
        .arg(p)
        .arg(token)
        .invoke_async(con)
        .await?;
    Ok(n == 1)
}
