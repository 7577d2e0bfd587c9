//! An executor's claims and heartbeat: `claim.lua`, the composed `complete.lua+claim.lua`,
//! `extend.lua`.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{ScriptInvocation, Value};

use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::model::{Job, ShardRef};

use super::claimed::Claimed;
use super::decode::{codes, int, string, ItemCodes};
use super::finish::{completion_argc, completion_args, Finished};
use super::registry::*;

/// What one claim call returned.
#[derive(Debug, Clone, Default)]
pub struct ClaimOutcome {
    /// The shards claimed (at most the count asked for).
    pub shards: Vec<Claimed>,
    /// The queue is paused.
    pub paused: bool,
    /// When nothing was claimed: how many ms from now (by the Redis server's clock) the earliest
    /// delayed shard or task is due, or the queue's rate limit lets the next shard start.
    pub next_due_in_ms: Option<u64>,
    /// The claim had to take the executor's lease again (it had expired): some held shards may
    /// have been recovered meanwhile, so the executor must check its tokens (see [`extend`]).
    pub lease_lapsed: bool,
    /// Every shard asked for was wanted ahead and none could be taken ahead (the queue has a
    /// rate limit, or no task is measured short, docs/design/fairness.md): nothing was claimed;
    /// ask again when a run slot frees.
    pub busy: bool,
    /// The queue has a rate limit: hold nothing ahead (shards claimed ahead before the limit
    /// was set would start uncounted).
    pub limited: bool,
}

/// What [`claim`] asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Shards wanted.
    pub count: usize,
    /// Lock time to live.
    pub lock_ms: u64,
    /// The executor's instance: its lease is its entry in `leases` and the token of this claim
    /// is `<instance>:<seq>` (the glossary's instance and claim call).
    pub instance: &'a str,
    /// This claim's sequence number (one token per claim call).
    pub seq: u64,
    /// The executor's node id: refs routed to it are claimed too.
    pub node: &'a str,
    /// How many of `count` are wanted ahead of a free run slot (they wait, held, until one frees).
    /// Under a queue rate limit the claim takes only the others, so that the limit counts starts:
    /// with none startable now it claims nothing and says [`ClaimOutcome::busy`].
    pub ahead: usize,
    /// Which tasks' fresh shards may be claimed ahead (docs/design/fairness.md): a list joined
    /// by commas of ids (measured short: any number) and `-id`s (measured long, or enough held
    /// untried: none), and how many a task not named may get (to try it out); `None`: any task,
    /// any number.
    pub speeds: Option<(&'a str, usize)>,
    /// The kinds served: only their lanes are read (docs/design/lanes.md).
    pub kinds: &'a crate::kinds::Served,
}

/// Claims up to `req.count` shards under one token, and renews the executor's lease.
pub async fn claim<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, req: &ClaimRequest<'_>) -> Result<ClaimOutcome> {
    let token = format!("{}:{}", req.instance, req.seq);
    let mut inv = scripts().claim.keyed(keys, &KeyArgs { node: Some(req.node), ..Default::default() });
    claim_args(&mut inv, keys, req, &token);
    let v: Vec<Value> = inv.invoke_async(con).await?;
    parse_claim(&v, &token)
}

/// Records `completed` (every item a completion; codes as [`finish`](super::finish::finish)'s) and then claims as
/// [`claim`] does, in one script call (`complete.lua` then `claim.lua`, atomically).
pub async fn complete_and_claim<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    completed: &[Finished<'_>],
    req: &ClaimRequest<'_>,
) -> Result<(ItemCodes, ClaimOutcome)> {
    let token = format!("{}:{}", req.instance, req.seq);
    let mut order: Vec<usize> = (0..completed.len()).collect();
    let mut inv = scripts().complete_claim.keyed(keys, &KeyArgs { node: Some(req.node), ..Default::default() });
    inv.arg(completion_argc(completed, &mut order)?);
    completion_args(&mut inv, keys, completed, &order);
    inv.arg(CLAIM_ARGC);
    claim_args(&mut inv, keys, req, &token);
    let (c, v): (Vec<i64>, Vec<Value>) = inv.invoke_async(con).await?;
    let mut out: ItemCodes = vec![Ok(0); completed.len()];
    for (&i, c) in order.iter().zip(codes(c)) {
        out[i] = c;
    }
    Ok((out, parse_claim(&v, &token)?))
}

/// How many arguments [`claim_args`] passes.
const CLAIM_ARGC: usize = 8;

fn claim_args(inv: &mut ScriptInvocation<'_>, keys: &Keys, req: &ClaimRequest<'_>, token: &str) {
    inv.arg(keys.prefix())
        .arg(req.count)
        .arg(req.lock_ms)
        .arg(token)
        .arg(req.count.saturating_sub(req.ahead))
        .arg(req.kinds.to_string())
        .arg(req.speeds.map_or("*", |s| s.0))
        .arg(req.speeds.map_or(0, |s| s.1));
}

fn parse_claim(v: &[Value], token: &str) -> Result<ClaimOutcome> {
    let [head, flags, shards @ ..] = v else {
        return Err(Error::Protocol("short claim reply".into()));
    };
    let head = int(head)?;
    let mut out = ClaimOutcome {
        paused: head == -2,
        busy: head == -3,
        next_due_in_ms: (head > 0).then_some(head as u64),
        lease_lapsed: int(flags)? & 1 == 1,
        limited: int(flags)? & 2 == 2,
        ..Default::default()
    };
    for quad in shards.chunks(4) {
        let [r, a, f, inc] = quad else {
            return Err(Error::Protocol("claim reply is not ref/attempt/fails/inc quadruples".into()));
        };
        let first: ShardRef = string(r)?.parse()?;
        let task_inc: Arc<str> = Arc::from(string(inc)?);
        match (int(a)?, &first.job) {
            // a run of k fresh shards from `first`: attempt 1, no fails
            (a, &Job::Shard(from)) if a < 0 => {
                for i in from..from + a.unsigned_abs() {
                    let shard_ref = ShardRef { job: Job::Shard(i), ..first.clone() };
                    out.shards.push(Claimed {
                        shard_ref,
                        token: token.to_owned(),
                        attempt: 1,
                        fails: 0,
                        task_inc: task_inc.clone(),
                        backup: false,
                    });
                }
            }
            (a, _) if a < 0 => return Err(Error::Protocol(format!("claim reply: a run from {first}"))),
            // a backup attempt's fails come as -1 - fails (lua/claim.lua)
            (a, _) => {
                let f = int(f)?;
                out.shards.push(Claimed {
                    shard_ref: first,
                    token: token.to_owned(),
                    attempt: a as u32,
                    fails: if f < 0 { (-1 - f) as u32 } else { f as u32 },
                    task_inc,
                    backup: f < 0,
                })
            }
        }
    }
    Ok(out)
}

/// What a heartbeat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// Positions (0-based) in `held` of the shards lost.
    pub lost: Vec<usize>,
    /// Positions (0-based) in `held` of shards lost because their task was cancelled.
    pub cancelled: Vec<usize>,
    /// The queue's cancellation count (pass it to the next [`extend`]).
    pub cancels: String,
}

/// The heartbeat of executor `instance`: extends its lease by `lock_ms`, one call when the lease
/// lived and no task was cancelled since `cancels` was read. If the lease had expired, tasks were
/// cancelled, or `check` asks for it (a claim took a lapsed lease again), a call with `held`
/// (ref, token) compares the tokens and takes the lease again.
pub async fn extend<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    instance: &str,
    lock_ms: u64,
    held: &[(String, String)],
    check: bool,
    cancels: &str,
) -> Result<Beat> {
    let call = |mode: &str, pairs: &[(String, String)]| {
        let mut inv = scripts().extend.keyed(keys, &KeyArgs::default());
        inv.arg(instance).arg(lock_ms).arg(mode).arg(cancels);
        for (r, t) in pairs {
            inv.arg(r).arg(t);
        }
        inv
    };
    let parse = |v: Vec<Value>| -> Result<(i64, Beat)> {
        let [status, cancels, lost @ ..] = v.as_slice() else {
            return Err(Error::Protocol("short heartbeat reply".into()));
        };
        let mut beat = Beat { cancels: string(cancels)?, ..Default::default() };
        for p in lost {
            // a negative pair number: lost because its task was cancelled
            match int(p)? {
                p if p > 0 => beat.lost.push(p as usize - 1),
                p if p < 0 => beat.cancelled.push((-p) as usize - 1),
                _ => return Err(Error::Protocol("pair number 0 in a heartbeat reply".into())),
            }
        }
        Ok((int(status)?, beat))
    };
    if !check {
        let (status, beat) = parse(call("beat", &[]).invoke_async(con).await?)?;
        if status == 0 {
            return Ok(beat);
        }
    }
    Ok(parse(call("check", held).invoke_async(con).await?)?.1)
}
