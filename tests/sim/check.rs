//! The invariants, checked after every step on the snapshot against the model:
//! - each live task: its incarnation and state are the model's; `done`/`failed` are the counts
//!   of what the model accepted, equal to the set terminal bits, never past `total`, and
//!   `done + failed == total` exactly when every shard is terminal; no bit past `total`;
//! - results only of completed shards, each written with the spec of this incarnation; reasons
//!   for every failed shard and for no completed one;
//! - no lost and no duplicated shard: a shard handed out and not terminal is in exactly one of
//!   `wait`, `active`, `delayed`, a node list, `reroute`; a terminal or not yet handed out one
//!   (past a pull task's `cursor`, past a routed task's `routed` cursor) in none; the
//!   aggregation job exactly once while aggregating (one per round) and never otherwise;
//! - a routed task is in `unrouted` exactly while it runs not fully placed;
//! - `nodes` holds exactly the executors the model counts as members (an expired one with its
//!   score in the past), `routed-nodes` only the executors' nodes, and lists only refs;
//! - only current incarnations of unended tasks are held or delayed, only non-terminal shards
//!   are held;
//! - a backup attempt (docs/design/speculation.md) is of a shard whose first attempt another
//!   executor holds, of a task with `--speculate`, and a task's `spec_started` counts the
//!   backups its claims started, within its cap;
//! - a halted task says so, ended failed, never aggregates (no aggregation job queued) and
//!   holds or queues nothing; a running task is within its failure limit;
//! - a task the model does not know (never dispatched, cleaned, expired) has no key at all;
//! - a lane's wait holds refs of its own kind only (of the current incarnations), and a lane
//!   with refs waiting is listed in `kinds` (so that an executor serving every kind finds it).

use std::collections::HashMap;

use shardctl_common::model::{Job, ShardRef};

use super::executor::{instance_of, Member};
use super::model::{State, TaskModel, Term};
use super::snapshot::TaskView;
use super::world::World;
use super::Outcome;

impl World {
    /// Each lane's refs are of its kind; a lane with refs is in `kinds`.
    fn check_lanes(&self) -> Outcome {
        for (l, lane) in self.snap.lanes.iter().enumerate() {
            let kind = super::operators::KINDS[l];
            ensure!(lane.is_empty() || self.snap.kinds.contains(kind), "lane {kind} holds {lane:?}, not in `kinds`");
            for r in lane {
                let Ok(sr) = r.parse::<ShardRef>() else { return Err(format!("lane {kind} holds a non-ref {r}")) };
                if let Some(tm) = self.model.tasks.get(&sr.task).filter(|tm| tm.inc == sr.seq) {
                    ensure!(tm.kind == kind, "lane {kind} holds {r} of kind {}", tm.kind);
                }
            }
        }
        Ok(())
    }

    /// Every invariant on the last snapshot.
    pub fn check(&self) -> Outcome {
        let mut copies: HashMap<&str, usize> = HashMap::new();
        for r in self.snap.placed() {
            *copies.entry(r.as_str()).or_default() += 1;
        }
        self.check_membership()?;
        self.check_lanes()?;
        self.check_fair()?;
        for id in &self.ids {
            let v = &self.snap.tasks[id];
            match self.model.tasks.get(id) {
                None => ensure!(
                    v.hash.is_empty() && v.keys == 0,
                    "task {id} is not in the model (never dispatched, cleaned or expired) but {} of its keys exist: {:?}",
                    v.keys,
                    v.hash
                ),
                Some(tm) => {
                    check_task(id, tm, v, &copies)?;
                    let listed = self.snap.unrouted.contains(id);
                    let want = tm.routed() && tm.state == State::Running && v.num("routed") < tm.total;
                    ensure!(listed == want, "task {id}:{} ({:?}) in `unrouted`: {listed}", tm.inc, tm.state);
                }
            }
        }
        for (r, t) in &self.snap.active {
            let sr: ShardRef = r.parse().map_err(|e| format!("held ref {r}: {e}"))?;
            let tm = self.model.tasks.get(&sr.task).filter(|tm| tm.inc == sr.seq);
            let Some(tm) = tm else { return Err(format!("{r} is held by {t}: not the current incarnation")) };
            ensure!(!tm.state.ended(), "{r} is held by {t}, its task is {:?}", tm.state);
            if let Job::Shard(i) = sr.job {
                ensure!(
                    i < tm.total && tm.terminal[i as usize].is_none(),
                    "{r} is held by {t}: terminal or past the total"
                );
            }
        }
        for (r, b) in &self.snap.backups {
            let first = self.snap.active.get(r);
            ensure!(
                first.is_some_and(|t| instance_of(t) != instance_of(b)),
                "backup {b} of {r}, whose first attempt is {first:?}"
            );
            let sr: ShardRef = r.parse().map_err(|e| format!("backup ref {r}: {e}"))?;
            let tm = self.model.tasks.get(&sr.task).filter(|tm| tm.inc == sr.seq);
            ensure!(tm.is_some_and(|tm| tm.speculate.is_some()), "backup {b} of {r}: not of a task with --speculate");
        }
        for (id, tm) in &self.model.tasks {
            let started = self.snap.tasks[id].num("spec_started");
            ensure!(
                started == tm.spec_started,
                "task {id} says {started} backups started, the model {}",
                tm.spec_started
            );
            ensure!(started <= tm.speculate.unwrap_or(0), "task {id} started {started} backups, past its cap");
        }
        for r in &self.snap.delayed {
            let sr: ShardRef = r.parse().map_err(|e| format!("delayed ref {r}: {e}"))?;
            let tm = self.model.tasks.get(&sr.task).filter(|tm| tm.inc == sr.seq && !tm.state.ended());
            ensure!(tm.is_some(), "{r} waits in `delayed`: not a running incarnation");
        }
        Ok(())
    }

    /// `nodes` and `routed-nodes` against the executors.
    fn check_membership(&self) -> Outcome {
        for ex in &self.execs {
            let score = self.snap.nodes.get(&ex.node);
            match ex.member {
                Member::Out => ensure!(score.is_none(), "node {} left but is in `nodes` ({score:?})", ex.node),
                Member::Live => ensure!(score.is_some_and(|s| s != "1"), "live node {} scored {score:?}", ex.node),
                Member::Expired => {
                    ensure!(score.is_some_and(|s| s == "1"), "expired node {} scored {score:?}", ex.node)
                }
            }
        }
        ensure!(self.snap.nodes.len() <= self.execs.len(), "`nodes` holds strangers: {:?}", self.snap.nodes);
        for n in &self.snap.routed_nodes {
            ensure!(self.nodes.contains(n), "`routed-nodes` names {n}, no executor's node");
        }
        for (n, l) in &self.snap.lists {
            ensure!(
                l.is_empty() || self.snap.routed_nodes.contains(n),
                "node {n} has a list {l:?} but is not in `routed-nodes`"
            );
        }
        Ok(())
    }
}

fn check_task(id: &str, tm: &TaskModel, v: &TaskView, copies: &HashMap<&str, usize>) -> Outcome {
    ensure!(!v.hash.is_empty(), "task {id} (incarnation {}, {:?}) is gone from Redis", tm.inc, tm.state);
    let inc = tm.inc;
    ensure!(v.num("seq") == inc, "task {id} is incarnation {}, the model's is {inc}", v.num("seq"));
    let state = v.hash.get("state").map(String::as_str).unwrap_or("");
    ensure!(state == tm.state.as_str(), "task {id}:{inc} is {state}, the model says {:?}", tm.state);
    let (total, done, failed) = (v.num("total"), v.num("done"), v.num("failed"));
    ensure!(total == tm.total, "task {id}:{inc} total {total}, dispatched {}", tm.total);
    let past = v.bits_from(total);
    ensure!(past.is_empty(), "task {id}:{inc}: terminal bits past its {total} shards: {past:?}");
    let set = (0..total).filter(|&i| v.bit(i)).count() as u64;
    ensure!(done + failed == set, "task {id}:{inc}: done {done} + failed {failed} but {set} terminal bits");
    ensure!(done + failed <= total, "task {id}:{inc}: done {done} + failed {failed} over total {total}");
    for i in 0..total {
        ensure!(v.bit(i) == tm.terminal[i as usize].is_some(), "task {id}:{inc}: shard {i} terminal is {}", v.bit(i));
    }
    let (mdone, mfailed) = (tm.count(Term::Done), tm.count(Term::Failed));
    ensure!(
        (done, failed) == (mdone, mfailed),
        "task {id}:{inc}: done/failed {done}/{failed}, accepted {mdone}/{mfailed}"
    );
    for (k, val) in &v.results {
        let i: u64 = k.parse().map_err(|_| format!("task {id}: result field {k}"))?;
        ensure!(i < total && tm.terminal[i as usize] == Some(Term::Done), "task {id}:{inc}: a result for shard {i}");
        let want = TaskModel::result(inc, tm.nonce, i);
        ensure!(*val == want, "task {id}:{inc}: shard {i}'s result {val} was not made by this incarnation ({want})");
    }
    for i in 0..total {
        let (r, e) = (v.results.contains_key(&i.to_string()), v.errors.contains_key(&i.to_string()));
        match tm.terminal[i as usize] {
            Some(Term::Done) => ensure!(r && !e, "task {id}:{inc}: completed shard {i}: result {r}, reason {e}"),
            Some(Term::Failed) => ensure!(e, "task {id}:{inc}: failed shard {i} has no reason"),
            None => ensure!(!r, "task {id}:{inc}: unfinished shard {i} has a result"),
        }
    }
    match tm.state {
        State::Completed => {
            let want = TaskModel::agg_result(inc, tm.nonce);
            ensure!(v.hash.get("result") == Some(&want), "task {id}:{inc} completed with {:?}", v.hash.get("result"));
        }
        State::Failed if mfailed == 0 => ensure!(v.hash.contains_key("agg_error"), "task {id}:{inc} failed, no reason"),
        _ => {}
    }
    let cancelled = u32::from(tm.state == State::Cancelled);
    ensure!(
        tm.ends <= tm.rounds + cancelled + tm.halts,
        "task {id}:{inc} ended {} times in {} rounds and {} halts",
        tm.ends,
        tm.rounds,
        tm.halts
    );
    // k-of-n: a settled task counts its cancelled shards, and only a settled one
    let cancelled = v.hash.get("cancelled").map(|c| c.parse::<u64>().unwrap_or(u64::MAX));
    ensure!(
        cancelled == tm.settled.then(|| tm.cancelled()),
        "task {id}:{inc}: `cancelled` {cancelled:?}, the model says {:?}",
        tm.settled.then(|| tm.cancelled())
    );
    // a halt is said, and only while it stands (docs/design/failure-policies.md)
    let said = v.hash.contains_key("halted");
    ensure!(said == tm.halted, "task {id}:{inc}: `halted` {said}, the model says {}", tm.halted);
    ensure!(!tm.halted || tm.state == State::Failed, "task {id}:{inc} halted but {:?}", tm.state);
    if let Some(m) = tm.max_failures.filter(|_| !tm.halted && tm.state == State::Running) {
        ensure!(mfailed <= m, "task {id}:{inc}: {mfailed} shards failed past its limit of {m}, and it runs");
    }
    if tm.state == State::Cancelled {
        // its queued refs are left for the claims to drop
        return Ok(());
    }
    // shards a pull task handed out are below its cursor; a routed task's, below its `routed`
    let cursor = if tm.routed() { v.num("routed") } else { v.num("cursor") };
    ensure!(cursor <= total, "task {id}:{inc}: cursor {cursor} past its {total} shards");
    for i in 0..total {
        let r = format!("{id}:{inc}:{i}");
        let n = copies.get(r.as_str()).copied().unwrap_or(0);
        let want = usize::from(i < cursor && tm.terminal[i as usize].is_none() && !tm.state.ended() && !tm.settled);
        ensure!(
            n == want,
            "shard {r} ({:?}, cursor {cursor}) is queued or held {n} times, expected {want}",
            tm.terminal[i as usize]
        );
    }
    let agg = format!("{id}:{inc}:agg");
    let n = copies.get(agg.as_str()).copied().unwrap_or(0);
    let want = usize::from(tm.state == State::Aggregating);
    ensure!(n == want, "aggregation job {agg} of a task {:?} is queued or held {n} times, expected {want}", tm.state);
    Ok(())
}
