//! Routed tasks: the coordinator's dispatch (`dispatch`: the task, then its placement on the
//! live nodes' lists chunk by chunk), a dispatch cut short (placed part-way, or not at all) and
//! its resumption, executors joining (`join.lua`, the membership heartbeat), leaving gracefully
//! (`leave.lua`) and departing (their membership runs out: their score is set to the past), the
//! real rebalance (`coordinator::rebalance::rebalance`: reap, place, drain `reroute`, fail
//! departed lists over, re-place live lists), and the races a rebalancer loses: a placement from
//! a stale cursor (`route.lua` answers -6) and a move of a list's head that changed meanwhile
//! (`rehome.lua` answers -7). Each is checked against the model before the step's full check.

use redis::AsyncCommands;
use shardctl_common::model::{Job, ShardRef, TaskSpec};
use shardctl_common::ring::{Placement, DEFAULT_VNODES};
use shardctl_common::{scripts, Error, ScriptCode};
use shardctl_coordinator::dispatch::dispatch;
use shardctl_coordinator::rebalance::rebalance;

use super::executor::Member;
use super::model::State;
use super::world::{replace_list, World};
use super::Outcome;

/// The executors' member timeout: never runs out by itself (departure is a step).
const MEMBER_MS: u64 = 600_000;

impl World {
    /// The nodes the model counts as live, sorted.
    pub fn live_nodes(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.execs.iter().filter(|e| e.member == Member::Live).map(|e| e.node.clone()).collect();
        v.sort();
        v
    }

    /// The owner of `r` under the live set `live` (a ref of no running routed task: the first).
    fn owner(&self, live: &[String], r: &str) -> String {
        if let Ok(ShardRef { task, seq: inc, job: Job::Shard(i) }) = r.parse::<ShardRef>() {
            if let Some(tm) = self.model.tasks.get(&task).filter(|t| t.inc == inc && t.routed()) {
                let p = Placement::new(tm.strategy, live, DEFAULT_VNODES);
                return p.owner(i, &i.to_string()).expect("a live node").to_owned();
            }
        }
        live[0].clone()
    }

    /// The coordinator's dispatch of routed `spec`: checks what it says it placed.
    pub async fn dispatch_routed(&mut self, spec: &TaskSpec) -> Result<Result<(), Error>, String> {
        let live = self.live_nodes();
        match dispatch(&mut self.con, &self.keys, spec, None).await {
            Ok(d) => {
                let placed = if live.is_empty() { 0 } else { spec.shards };
                ensure!(
                    !d.resumed && d.placed == placed && d.live == live.len(),
                    "dispatch of {} with live {live:?} says {d:?}, the model expects {placed} placed",
                    spec.id
                );
                Ok(Ok(()))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// A dispatcher that died after placing the first `n` shards of `id` (with route.lua).
    pub async fn route_part(&mut self, id: &str, n: u64) -> Outcome {
        let live = self.live_nodes();
        if n == 0 || live.is_empty() {
            return Ok(());
        }
        let owners: Vec<String> =
            (0..n).map(|i| self.owner(&live, &format!("{id}:{}:{i}", self.model.tasks[id].inc))).collect();
        let owners: Vec<&str> = owners.iter().map(String::as_str).collect();
        let r = scripts::route(&mut self.con, &self.keys, id, 0, &owners).await;
        self.note(format!("  {id}: the dispatcher places {n} shards on {owners:?}, then dies: {r:?}"));
        ensure!(matches!(r, Ok(to) if to == n), "route of {id}'s first {n} shards answered {r:?}");
        Ok(())
    }

    /// The dispatch of a routed task cut short is run again with the same spec: it resumes.
    pub async fn resume(&mut self) -> Outcome {
        let open: Vec<String> = self
            .model
            .tasks
            .iter()
            .filter(|(id, t)| t.routed() && t.state == State::Running && self.snap.tasks[*id].num("routed") < t.total)
            .map(|(id, _)| id.clone())
            .collect();
        if open.is_empty() {
            self.note("no dispatch to resume".into());
            return Ok(());
        }
        let id = open[self.rng.below(open.len())].clone();
        let tm = &self.model.tasks[&id];
        let (spec, total) = (tm.spec.clone().expect("a routed task keeps its spec"), tm.total);
        let live = self.live_nodes();
        let r = dispatch(&mut self.con, &self.keys, &spec, None).await;
        self.note(format!("dispatch of {id} again (live {live:?}): {r:?}"));
        let placed = if live.is_empty() { 0 } else { total };
        ensure!(
            matches!(&r, Ok(d) if d.resumed && d.placed == placed && d.live == live.len()),
            "dispatch of {id} again answered {r:?}, the model expects it resumed with {placed} placed"
        );
        Ok(())
    }

    /// A placement from a stale cursor (another router placed that chunk first): refused.
    pub async fn stale_route(&mut self) -> Outcome {
        let placed: Vec<(String, u64)> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| t.routed() && t.state != State::Cancelled)
            .map(|(id, _)| (id.clone(), self.snap.tasks[id].num("routed")))
            .filter(|(_, r)| *r > 0)
            .collect();
        if placed.is_empty() {
            self.note("no placement to race".into());
            return Ok(());
        }
        let (id, routed) = placed[self.rng.below(placed.len())].clone();
        let from = self.rng.range(0, routed - 1);
        let node = self.execs[0].node.clone();
        let r = scripts::route(&mut self.con, &self.keys, &id, from, &[node.as_str()]).await;
        self.note(format!("a late router places {id} from {from} (routed {routed}): {r:?}"));
        ensure!(
            matches!(r, Err(Error::Script(ScriptCode::RouteMoved))),
            "route of {id} from {from}, its cursor at {routed}, answered {r:?}"
        );
        Ok(())
    }

    /// Executor `e`'s membership heartbeat (joins, or refreshes).
    pub async fn join(&mut self, e: usize) -> Outcome {
        let (node, inst) = (self.execs[e].node.clone(), self.execs[e].instance.clone());
        // the kinds it serves: the ring places a task's shards on members that serve its kind
        let fields = [("host", "sim".to_owned()), ("pid", e.to_string()), ("kinds", self.execs[e].served.to_string())];
        let r = scripts::join(&mut self.con, &self.keys, &node, &inst, MEMBER_MS, None, &fields).await;
        self.note(format!("{inst} joins as node {node} ({:?}): {r:?}", self.execs[e].member));
        ensure!(matches!(r, Ok(Ok(()))), "join of {node} by {inst} answered {r:?}");
        self.execs[e].member = Member::Live;
        Ok(())
    }

    /// Executor `e` leaves gracefully.
    pub async fn leave(&mut self, e: usize) -> Outcome {
        let (node, inst) = (self.execs[e].node.clone(), self.execs[e].instance.clone());
        let r = scripts::leave(&mut self.con, &self.keys, &node, &inst).await;
        let was = self.execs[e].member;
        self.note(format!("{inst} leaves node {node} ({was:?}): {r:?}"));
        let want = was != Member::Out;
        ensure!(matches!(r, Ok(b) if b == want), "leave of {node} ({was:?}) answered {r:?}, expected {want}");
        self.execs[e].member = Member::Out;
        Ok(())
    }

    /// Executor `e`'s membership runs out (it stopped beating): its score is in the past.
    pub async fn depart(&mut self, e: usize) -> Outcome {
        let node = self.execs[e].node.clone();
        if self.execs[e].member == Member::Out {
            self.note(format!("node {node} is no member to depart"));
            return Ok(());
        }
        let n: u64 = redis::cmd("ZADD")
            .arg(self.keys.nodes())
            .arg("XX")
            .arg("CH")
            .arg(1)
            .arg(&node)
            .query_async(&mut self.con)
            .await
            .map_err(|e| format!("ZADD nodes: {e}"))?;
        self.note(format!("node {node}'s membership runs out ({:?}, {n})", self.execs[e].member));
        self.execs[e].member = Member::Expired;
        Ok(())
    }

    /// One rebalance, checked against the snapshot before it.
    pub async fn rebalance(&mut self) -> Outcome {
        let mut expired: Vec<String> =
            self.execs.iter().filter(|e| e.member == Member::Expired).map(|e| e.node.clone()).collect();
        expired.sort();
        let live = self.live_nodes();
        let pre = self.snap.clone();
        let r = rebalance(&mut self.con, &self.keys).await.map_err(|e| format!("rebalance: {e}"))?;
        self.note(format!("rebalance (live {live:?}, expired {expired:?}): {r:?}"));
        let Some(mut rep) = r else { return Err("the rebalance lock is taken, no rebalancer runs".into()) };
        // it removes the flag at its end, whoever set it
        self.rebalancing = false;
        for ex in self.execs.iter_mut().filter(|e| e.member == Member::Expired) {
            ex.member = Member::Out;
        }
        rep.departed.sort();
        ensure!(rep.departed == expired, "rebalance reaped {:?}, expired are {expired:?}", rep.departed);
        ensure!(rep.live == live, "rebalance found live {:?}, the model {live:?}", rep.live);
        let left: i64 = redis::cmd("EXISTS")
            .arg(self.keys.rebalancing())
            .arg(self.keys.rebalance_lock())
            .query_async(&mut self.con)
            .await
            .map_err(|e| format!("EXISTS: {e}"))?;
        ensure!(left == 0, "the rebalance left its lock or its flag behind");
        self.refresh().await;
        self.canonical_node_lists().await?;
        if live.is_empty() {
            ensure!(!rep.changed() || !rep.departed.is_empty(), "a rebalance with no live node moved refs: {rep:?}");
            return Ok(());
        }
        let unplaced: u64 =
            pre.unrouted.iter().map(|id| pre.tasks[id].num("total") - pre.tasks[id].num("routed")).sum();
        let orphans: u64 = pre
            .lists
            .iter()
            .filter(|(n, _)| !live.contains(n) && pre.routed_nodes.contains(n))
            .map(|(_, l)| l.len() as u64)
            .sum();
        ensure!(
            (rep.placed, rep.rerouted, rep.failed_over) == (unplaced, pre.reroute.len() as u64, orphans),
            "rebalance placed/rerouted/failed over {}/{}/{}, expected {unplaced}/{}/{orphans}",
            rep.placed,
            rep.rerouted,
            rep.failed_over,
            pre.reroute.len()
        );
        ensure!(self.snap.reroute.is_empty(), "after a rebalance `reroute` holds {:?}", self.snap.reroute);
        ensure!(self.snap.unrouted.is_empty(), "after a rebalance `unrouted` holds {:?}", self.snap.unrouted);
        for (n, l) in &self.snap.lists {
            ensure!(live.contains(n) || l.is_empty(), "after a rebalance departed node {n} keeps {l:?}");
        }
        for n in &self.snap.routed_nodes {
            ensure!(live.contains(n), "after a rebalance `routed-nodes` names departed {n}");
        }
        Ok(())
    }

    /// A rebalancer mid-way through re-placing the live lists (it set `rebalancing`), or done.
    pub async fn flag_rebalancing(&mut self) -> Outcome {
        let key = self.keys.rebalancing();
        let r: redis::RedisResult<()> = if self.rebalancing {
            self.con.del(&key).await
        } else {
            redis::cmd("SET").arg(&key).arg(1).arg("PX").arg(600_000).query_async(&mut self.con).await
        };
        r.map_err(|e| format!("rebalancing: {e}"))?;
        self.rebalancing = !self.rebalancing;
        self.note(format!("rebalancing = {}", self.rebalancing));
        Ok(())
    }

    /// While `rebalancing` is set a claim pops no node list: each list before it starts what it
    /// holds after it (due routed retries may have joined their node's list at its back).
    pub async fn check_lists_untouched(&mut self, before: &[(String, Vec<String>)]) -> Outcome {
        self.refresh().await;
        for (n, l) in before {
            let now = self.snap.list(n);
            ensure!(
                now.starts_with(l),
                "a claim while `rebalancing` is set took from node {n}'s list {l:?}: now {now:?}"
            );
        }
        Ok(())
    }

    /// A rebalance's order of work follows `unrouted` (scored by creation time, which depends on
    /// how fast the steps ran): each node list is sorted after it, so that a seed replays step
    /// for step. No order within a node list is promised.
    async fn canonical_node_lists(&mut self) -> Outcome {
        for (n, l) in self.snap.lists.iter_mut() {
            let mut sorted = l.clone();
            sorted.sort();
            if sorted != *l {
                replace_list(&mut self.con, &self.keys.node_wait(n), &sorted).await?;
                *l = sorted;
            }
        }
        Ok(())
    }

    /// A rebalancer reads the head of a list, something changes the list, then it moves the head
    /// it read: applied only if the head is still the same.
    pub async fn stale_rehome(&mut self) -> Outcome {
        let live = self.live_nodes();
        let mut sources: Vec<Option<usize>> =
            (0..self.execs.len()).filter(|&e| !self.snap.list(&self.execs[e].node).is_empty()).map(Some).collect();
        if !self.snap.reroute.is_empty() {
            sources.push(None);
        }
        if live.is_empty() || sources.is_empty() {
            self.note("no list to race a rebalancer over".into());
            return Ok(());
        }
        let src = sources[self.rng.below(sources.len())];
        let key = src.map_or_else(|| self.keys.reroute(), |e| self.keys.node_wait(&self.execs[e].node));
        let k = self.rng.range(1, 3) as isize;
        let head: Vec<String> = self.con.lrange(&key, 0, k - 1).await.map_err(|e| format!("LRANGE: {e}"))?;
        let dest: Vec<String> = head.iter().map(|r| self.owner(&live, r)).collect();
        self.note(format!("a rebalancer reads {head:?} at the head of {key}"));
        match src {
            Some(e) => {
                let count = self.rng.range(1, 3) as usize;
                self.claim(e, count, false).await?;
            }
            None => self.rebalance().await?,
        }
        let now: Vec<String> = self.con.lrange(&key, 0, k - 1).await.map_err(|e| format!("LRANGE: {e}"))?;
        let dest_ref: Vec<&str> = dest.iter().map(String::as_str).collect();
        let r = scripts::rehome(&mut self.con, &self.keys, &key, &head, &dest_ref).await;
        self.note(format!("  it moves them to {dest:?} (the head is now {now:?}): {r:?}"));
        let ok = if now.len() >= head.len() && now[..head.len()] == head[..] {
            matches!(r, Ok(n) if n == head.len() as u64)
        } else {
            matches!(r, Err(Error::Script(ScriptCode::HeadChanged)))
        };
        ensure!(ok, "rehome of {head:?} from {key}, whose head is now {now:?}, answered {r:?}");
        Ok(())
    }
}
