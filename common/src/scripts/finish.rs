//! Recording outcomes: completions and failures (`complete.lua`, `fail.lua`) and give-backs
//! (`release.lua`).

use redis::aio::ConnectionLike;
use redis::ScriptInvocation;

use crate::error::{Error, Result};
use crate::failure::Failure;
use crate::keys::Keys;
use crate::model::Job;

use super::claimed::Claimed;
use super::decode::{codes, ItemCodes};
use super::registry::*;

/// A finished attempt, as reported by an executor.
#[derive(Debug, Clone)]
pub struct Finished<'a> {
    /// The claim.
    pub claim: &'a Claimed,
    /// What to record.
    pub outcome: FinishedAs<'a>,
    /// How long the attempt ran, in ms by its executor's clock, if measured: a counted
    /// completion adds it to its task's histogram (docs/design/dashboard.md, "Where time goes").
    pub ran_ms: Option<u64>,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub enum FinishedAs<'a> {
    /// Success with a result (JSON text; empty when there is nothing to keep).
    Completed(&'a str),
    /// Failure, with the backoff before the next attempt, the reason and its class.
    Failed {
        /// Backoff before the next attempt (unused when none is left), or a retry-after's delay.
        delay_ms: u64,
        /// Why it failed.
        reason: &'a str,
        /// What the failure means (docs/design/failure-policies.md).
        failure: Failure,
    },
}

/// The result a completion keeps (empty for none); an error for a failure.
fn result_of<'a>(f: &Finished<'a>) -> Result<&'a str> {
    match f.outcome {
        FinishedAs::Completed(r) => Ok(r),
        FinishedAs::Failed { .. } => Err(Error::Invalid("only completions are recorded by complete.lua".into())),
    }
}

/// Whether a completion is plain: a shard without state or result, one argument in its group.
fn plain(f: &Finished<'_>) -> bool {
    !f.claim.has_state() && !f.claim.shard_ref.is_aggregate() && matches!(f.outcome, FinishedAs::Completed(""))
}

/// The group of a completion in `complete.lua`'s arguments: task, incarnation, token, plain.
fn group_of<'a>(f: &Finished<'a>) -> (&'a str, u64, &'a str, bool) {
    let c = f.claim;
    (c.shard_ref.task.as_str(), c.shard_ref.seq, c.token.as_str(), plain(f))
}

/// Sorts `order` (indexes into `items`, all completions) into `complete.lua`'s groups, and
/// returns how many arguments [`completion_args`] will pass.
pub(super) fn completion_argc(items: &[Finished<'_>], order: &mut [usize]) -> Result<usize> {
    // grouped by task, token and whether plain (a shard without state or result): the script
    // parses no refs, reads one index per plain shard, and touches each task's keys once
    order.sort_by(|&a, &b| group_of(&items[a]).cmp(&group_of(&items[b])));
    let mut n = 1;
    for group in order.chunk_by(|&a, &b| group_of(&items[a]) == group_of(&items[b])) {
        for &i in group {
            result_of(&items[i])?;
        }
        n += 8 + group.len() * if plain(&items[group[0]]) { 1 } else { 3 };
    }
    Ok(n)
}

/// `complete.lua`'s arguments for `items` in `order` (from [`completion_argc`]).
pub(super) fn completion_args(inv: &mut ScriptInvocation<'_>, keys: &Keys, items: &[Finished<'_>], order: &[usize]) {
    inv.arg(keys.prefix());
    for group in order.chunk_by(|&a, &b| group_of(&items[a]) == group_of(&items[b])) {
        let (task, inc, token, plain) = group_of(&items[group[0]]);
        inv.arg(task).arg(inc).arg(token).arg(group.len()).arg(if plain { "p" } else { "f" });
        // the run times as one byte per entry (1 + its bucket; 0: not measured), and the longest
        // with its entry (docs/design/dashboard.md, "Where time goes")
        let runs: Vec<u8> =
            group.iter().map(|&i| items[i].ran_ms.map_or(0, |ms| 1 + crate::durations::bucket(ms))).collect();
        let longest =
            group.iter().enumerate().filter_map(|(k, &i)| Some((items[i].ran_ms?, k + 1))).max_by_key(|&(ms, _)| ms);
        let (ms, at) = longest.unwrap_or((0, 0));
        inv.arg(runs).arg(ms).arg(at);
        for &i in group {
            let it = &items[i];
            match it.claim.shard_ref.job {
                Job::Shard(idx) => inv.arg(idx),
                Job::Aggregate => inv.arg("agg"),
            };
            if !plain {
                inv.arg(u8::from(it.claim.has_state())).arg(result_of(it).unwrap_or_default());
            }
        }
    }
}

/// Records completions (code 1 counted, 0 already terminal) and failures (2 retry scheduled or
/// deferred, 1 failed for good, 0 already terminal), each checked against its token. One code per item,
/// in the order given.
pub async fn finish<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    node: &str,
    items: &[Finished<'_>],
) -> Result<ItemCodes> {
    let (mut complete, mut fail) = (Vec::new(), Vec::new());
    for (i, it) in items.iter().enumerate() {
        match it.outcome {
            FinishedAs::Completed(_) => complete.push(i),
            FinishedAs::Failed { .. } => fail.push(i),
        }
    }
    let mut out: ItemCodes = vec![Ok(0); items.len()];
    if !complete.is_empty() {
        let items_done: Vec<Finished<'_>> = complete.iter().map(|&i| items[i].clone()).collect();
        let mut order: Vec<usize> = (0..items_done.len()).collect();
        completion_argc(&items_done, &mut order)?;
        let mut inv = scripts().complete.keyed(keys, &KeyArgs::default());
        completion_args(&mut inv, keys, &items_done, &order);
        let complete: Vec<usize> = order.iter().map(|&j| complete[j]).collect();
        let c: Vec<i64> = inv.invoke_async(con).await?;
        for (&i, c) in complete.iter().zip(codes(c)) {
            out[i] = c;
        }
    }
    if !fail.is_empty() {
        let mut inv = scripts().fail.keyed(keys, &KeyArgs::default());
        inv.arg(keys.prefix()).arg(node);
        for &i in &fail {
            let it = &items[i];
            let FinishedAs::Failed { delay_ms, reason, failure } = it.outcome else { unreachable!() };
            inv.arg(it.claim.shard_ref.to_string())
                .arg(&it.claim.token)
                .arg(it.claim.attempt)
                .arg(delay_ms)
                .arg(reason)
                .arg(failure.code());
        }
        let c: Vec<i64> = inv.invoke_async(con).await?;
        for (&i, c) in fail.iter().zip(codes(c)) {
            out[i] = c;
        }
    }
    Ok(out)
}

/// Gives claimed shards back to the front of `wait` (1 released), each checked against its token.
pub async fn release<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, claims: &[&Claimed]) -> Result<ItemCodes> {
    release_as(con, keys, claims, GiveBack::Started).await
}

/// Which shards [`release_as`] gives back, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// Shards that ran (stopped at shutdown): to the front of `wait`; the claim counted.
    Started,
    /// Shards claimed ahead that never started: to the front of `wait`, the claim undone (the
    /// next claim hands out the same `attempt`).
    Unstarted,
    /// Shards claimed ahead that never started: to the back of `wait`, behind the aggregation
    /// jobs and retries waiting there, the claim undone.
    Behind,
}

/// Gives claimed shards back as `how` says, each checked against its token.
pub async fn release_as<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    claims: &[&Claimed],
    how: GiveBack,
) -> Result<ItemCodes> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let mode = match how {
        GiveBack::Started => "front",
        GiveBack::Unstarted => "unstarted",
        GiveBack::Behind => "back",
    };
    let mut inv = scripts().release.keyed(keys, &KeyArgs::default());
    inv.arg(keys.prefix()).arg(mode);
    for c in claims {
        inv.arg(c.shard_ref.to_string()).arg(&c.token);
    }
    let c: Vec<i64> = inv.invoke_async(con).await?;
    Ok(codes(c))
}
