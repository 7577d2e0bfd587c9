//! The decision pass: the home of each running task over partitions halts or settles it from
//! its shares' counts (docs/design/failure-policies.md, Over partitions).

use redis::aio::ConnectionLike;
use shardctl_common::partition::Layout;
use shardctl_common::scripts::{self, Decided, ShareStop, ShareSums};
use shardctl_common::share::{at_task_index, num};
use shardctl_common::{Keys, Result};

/// [`report_pending`](super::report_pending) rounds per decision pass (about 1 s).
pub const DECIDE_EVERY: u32 = 5;

/// How long one process's pass keeps the others from making theirs: one pass per interval for
/// the queue, whatever the number of processes.
const DECIDE_LEASE: std::time::Duration = std::time::Duration::from_millis(900);

/// Tasks of the home's `running` read per page.
const PAGE: isize = 100;

/// One decision pass over the running tasks of `layout`'s home, unless another process made one
/// less than `DECIDE_LEASE` (900 ms) ago (the home's `decide-check`): for each, the sums of its shares'
/// counts go to the home's decision (`decide.lua`); the shares of a settled task still running
/// are settled (`stop_share.lua`), those of a halted one are stopped by
/// [`report_pending`](super::report_pending), which the home's `unreported` lists it for.
/// Returns how many tasks were decided now.
pub async fn decide_pass<C: ConnectionLike + Send>(con: &mut C, layout: &Layout) -> Result<u64> {
    let took: Option<String> = redis::cmd("SET")
        .arg(layout.home.decide_check())
        .arg(1)
        .arg("NX")
        .arg("PX")
        .arg(DECIDE_LEASE.as_millis() as u64)
        .query_async(con)
        .await?;
    if took.is_none() {
        tracing::debug!("decision pass: another process made it");
        return Ok(0);
    }
    let (mut decided, mut from) = (0, 0);
    loop {
        let ids: Vec<String> =
            redis::cmd("ZRANGE").arg(layout.home.running()).arg(from).arg(from + PAGE - 1).query_async(con).await?;
        for id in &ids {
            decided += u64::from(decide_task(con, layout, id).await?);
        }
        if (ids.len() as isize) < PAGE {
            return Ok(decided);
        }
        from += PAGE;
    }
}

/// Decides on task `id` if it runs over `layout`'s partitions; true when decided now.
async fn decide_task<C: ConnectionLike + Send>(con: &mut C, layout: &Layout, id: &str) -> Result<bool> {
    let home = &layout.home;
    let row: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(home.task(id))
        .arg(&["partition_tags", "state", "round", "max_failures", "success_when", "cancelled"])
        .query_async(con)
        .await?;
    // a task over other partitions (a change of the layout this process has not seen) is left
    // to those that have
    // (a delayed home too: its shares may start before it, on their servers' clocks)
    if row[0].as_deref() != Some(shardctl_common::partition::tags_of(layout).as_str())
        || !matches!(row[1].as_deref(), Some("running" | "delayed"))
    {
        return Ok(false);
    }
    let Some(inc) = shardctl_common::share::home_inc_of(con, home, id).await? else { return Ok(false) };
    let mut sums = ShareSums { inc, round: num(&row[2]), ..Default::default() };
    let mut running: Vec<&Keys> = Vec::new();
    let fields = ["done", "failed", "round", "first_failure", "halt_asked", "base", "state", "halted"];
    for pk in &layout.partitions {
        let Some(v) = shardctl_common::share::read(con, pk, id, &sums.inc, &fields).await? else { continue };
        sums.done += num(&v[0]);
        if matches!(v[6].as_deref(), Some("running" | "delayed")) {
            running.push(pk);
        }
        // a share of an older round waits for the retry that reaches it: its failures, its
        // handlers' asks and its halt are not this round's
        if num(&v[2]) != sums.round {
            continue;
        }
        sums.failed += num(&v[1]);
        let base = num(&v[5]);
        if sums.first_failure.is_none() {
            sums.first_failure = v[3].as_deref().map(|f| at_task_index(base, f));
        }
        if sums.asked.is_none() {
            sums.asked = v[4].as_deref().map(|f| at_task_index(base, f));
        }
        // halted as its home ordered, which the home no longer says (a failover lost it)
        if sums.halted.is_none() {
            sums.halted = v[7].clone();
        }
    }
    tracing::debug!(task = %id, ?sums, "decision pass");
    let decided = if row[5].is_some() {
        // settled before: its shares still running are settled (again, after a rollback of
        // theirs), while its goal is met: a share that lost completions after its count runs
        // again until the goal is met anew
        if row[4].as_deref().and_then(|g| g.parse::<u64>().ok()).is_some_and(|goal| sums.done < goal) {
            return Ok(false);
        }
        false
    } else if row[3].is_none() && row[4].is_none() && sums.asked.is_none() && sums.halted.is_none() {
        return Ok(false);
    } else {
        match scripts::decide(con, home, id, &sums).await? {
            Decided::Halted => {
                tracing::info!(task = %id, failed = sums.failed, "the task failed fast over its partitions");
                return Ok(true);
            }
            Decided::Settled => {
                tracing::info!(task = %id, done = sums.done, "the task met its success goal over its partitions");
                true
            }
            Decided::Nothing => return Ok(false),
        }
    };
    for pk in running {
        scripts::stop_share(con, pk, id, &sums.inc, sums.round, &ShareStop::Settle).await?;
    }
    Ok(decided)
}
