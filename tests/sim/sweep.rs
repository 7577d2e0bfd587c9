//! The stalled sweep as a step: two calls, each either a full sweep (its throttle key removed
//! first, as if its interval had passed) or the lease pass alone (throttled). Each call is
//! checked against the snapshot before it: the refs it stalls are exactly the held refs whose
//! holder's lease expired, plus (full sweep) those the last full sweep marked whose holder still
//! has no live lease; each is requeued or failed for good (never lost, never left held), nothing
//! else held changes hands, no expired lease is left, and the new marks (full sweep) are exactly
//! the held refs whose holder has no lease entry.

use std::collections::{HashMap, HashSet};

use redis::AsyncCommands;
use shardctl_common::model::{Job, ShardRef};
use shardctl_common::scripts::{self, STALLED_REASON};

use super::model::{State, Term};
use super::world::{replace_list, World};
use super::Outcome;

impl World {
    /// Two sweeps (e.g. mark, confirm), each checked.
    pub async fn sweep(&mut self) -> Outcome {
        for _ in 0..2 {
            let max_stalled = self.rng.range(0, 2) as u32;
            let full = self.rng.below(3) > 0;
            let pre = self.snap.clone();
            if full {
                let () =
                    self.con.del(self.keys.stalled_check()).await.map_err(|e| format!("DEL stalled-check: {e}"))?;
            } else {
                // the throttle as if a full sweep had just run
                let () = self
                    .con
                    .set_ex(self.keys.stalled_check(), 1, 3600)
                    .await
                    .map_err(|e| format!("SET stalled-check: {e}"))?;
            }
            let out = scripts::sweep(&mut self.con, &self.keys, 3_600_000, max_stalled)
                .await
                .map_err(|e| format!("sweep: {e}"))?;
            self.note(format!("sweep (full {full}, max stalled {max_stalled}): {out:?}"));
            let expired_held = pre.active.values().any(|t| pre.expired(t));
            let Some(rep) = out.report else {
                ensure!(
                    !full && pre.expired.is_empty(),
                    "the sweep did nothing: full {full}, expired leases {:?}",
                    pre.expired
                );
                continue;
            };
            ensure!(
                full || !pre.expired.is_empty(),
                "a throttled sweep ran with no expired lease (held by expired holders: {expired_held})"
            );
            self.refresh().await;
            // tasks this sweep halted (a stall failed a shard past their limit): their refs left
            // every list and `active` with the halt, and they halt last
            let halted: HashSet<String> = self
                .model
                .tasks
                .iter()
                .filter(|(id, t)| !t.halted && self.snap.tasks[*id].hash.contains_key("halted"))
                .map(|(id, _)| id.clone())
                .collect();
            let of_halted = |r: &String| r.parse::<ShardRef>().is_ok_and(|sr| halted.contains(&sr.task));
            let kept = |l: &[String]| l.iter().filter(|r| !of_halted(r)).cloned().collect::<Vec<String>>();
            for lane in 0..pre.lanes.len() {
                self.canonical_requeue_order(&kept(&pre.lanes[lane]), Some(lane)).await?;
            }
            self.canonical_requeue_order(&kept(&pre.reroute), None).await?;
            ensure!(self.snap.expired.is_empty(), "the sweep left expired leases {:?}", self.snap.expired);
            let mut confirmed: Vec<&String> = pre
                .active
                .iter()
                .filter(|(r, t)| pre.expired(t) || (full && pre.stalled.contains(*r) && !pre.alive(t)))
                .map(|(r, _)| r)
                .collect();
            confirmed.sort();
            // a first attempt whose backup's holder has a lease not expired: the backup takes its
            // place (docs/design/speculation.md), nothing is requeued or counted
            let promoted: HashSet<&String> =
                confirmed.iter().copied().filter(|r| pre.backups.get(*r).is_some_and(|b| !pre.expired(b))).collect();
            let (mut recovered, mut failed) = (0, 0);
            for r in &confirmed {
                if promoted.contains(r) {
                    let now = self.snap.active.get(*r);
                    ensure!(
                        now == pre.backups.get(*r),
                        "the sweep left {r} to {now:?}, its backup is {:?}",
                        pre.backups[*r]
                    );
                    continue;
                }
                ensure!(!self.snap.active.contains_key(*r), "the sweep confirmed {r} stalled but left it held");
                let sr: ShardRef = r.parse().map_err(|e| format!("{e}"))?;
                let Some(tm) = self.model.tasks.get_mut(&sr.task).filter(|t| t.inc == sr.seq) else {
                    continue;
                };
                let view = &self.snap.tasks[&sr.task];
                let requeued = self.snap.wait.contains(*r) || self.snap.reroute.contains(*r);
                match sr.job {
                    Job::Shard(i) if view.bit(i) => {
                        ensure!(tm.terminal[i as usize].is_none(), "the sweep failed {r}, terminal already");
                        let reason = view.errors.get(&i.to_string());
                        ensure!(
                            reason.map(String::as_str) == Some(STALLED_REASON),
                            "{r} failed stalled with {reason:?}"
                        );
                        if halted.contains(&sr.task) {
                            tm.terminal[i as usize] = Some(Term::Failed);
                            tm.fails[i as usize] = 0;
                        } else {
                            ensure!(!tm.halts_on_failure(false), "the sweep failed {r} past its task's limit, no halt");
                            tm.set_terminal(i, Term::Failed);
                        }
                        failed += 1;
                    }
                    Job::Aggregate if view.hash.get("state").map(String::as_str) == Some("failed") => {
                        ensure!(tm.state == State::Aggregating, "the sweep failed {r} of a task {:?}", tm.state);
                        let e = view.hash.get("agg_error");
                        ensure!(e.map(String::as_str) == Some(STALLED_REASON), "{r} failed stalled with {e:?}");
                        tm.end_aggregation(false);
                        failed += 1;
                    }
                    _ => {
                        ensure!(
                            requeued || halted.contains(&sr.task),
                            "the sweep recovered {r} but did not requeue it"
                        );
                        recovered += 1;
                    }
                }
            }
            for id in &halted {
                let tm = self.model.tasks.get_mut(id).expect("a halted task");
                let failed = tm.count(Term::Failed);
                ensure!(tm.max_failures.is_some_and(|m| failed > m), "the sweep halted {id}, {failed} failed");
                tm.halt();
            }
            ensure!(
                (rep.recovered, rep.failed) == (recovered, failed),
                "sweep reports {rep:?}, the refs it confirmed ({confirmed:?}) say {recovered} recovered, {failed} failed"
            );
            let confirmed: HashSet<&String> = confirmed.into_iter().collect();
            for (r, t) in pre.active.iter().filter(|(r, _)| !confirmed.contains(r) && !of_halted(r)) {
                let now = self.snap.active.get(r);
                ensure!(now == Some(t), "the sweep moved {r} from {t} to {now:?}");
            }
            // (a backup with no lease entry that took a ref over in the lease pass is marked at the
            // next full sweep: the lease pass reads `active` before it)
            let marks: HashSet<String> = if full {
                self.snap
                    .active
                    .iter()
                    .filter(|(r, t)| !self.snap.alive(t) && (!promoted.contains(r) || pre.stalled.contains(*r)))
                    .map(|(r, _)| r.clone())
                    .collect()
            } else {
                // the lease pass leaves the marks of the last full sweep alone
                pre.stalled.clone()
            };
            ensure!(
                self.snap.stalled == marks,
                "the sweep marked {:?}, lease-less holders hold {marks:?}",
                self.snap.stalled
            );
            // backups: those of the confirmed refs went (taking over, or with their first attempt),
            // and so did those whose holder's lease expired (or, full sweep, has no entry)
            let kept: HashMap<String, String> = pre
                .backups
                .iter()
                .filter(|(r, b)| !confirmed.contains(r) && !pre.expired(b) && (!full || pre.alive(b)))
                .filter(|(r, _)| !of_halted(r))
                .map(|(r, b)| (r.clone(), b.clone()))
                .collect();
            let now: HashMap<String, String> =
                self.snap.backups.iter().filter(|(r, _)| !of_halted(r)).map(|(r, b)| (r.clone(), b.clone())).collect();
            ensure!(now == kept, "the sweep left backups {now:?}, expected {kept:?}");
            // `marked` counts the marks this call made: none in a lease pass (found by the long
            // mode, seed 1 step 12210: a lease pass after a full sweep had marked a ref)
            let made = if full { marks.len() as u64 } else { 0 };
            ensure!(rep.marked == made, "sweep says {} marked, {made} were (of {} marks)", rep.marked, marks.len());
            self.check()?;
        }
        Ok(())
    }

    /// The sweep requeues the refs it confirms in the order of `SMEMBERS stalled`, which follows
    /// the server's random hash seed: at the back of `wait`, and the aggregation jobs of tasks
    /// whose last shard it failed at the front. Sorting what it added at either end keeps a
    /// seed's replay step for step (no order among recovered refs is promised).
    /// Likewise for `reroute` (`lane`: None), where it puts recovered refs of routed tasks.
    async fn canonical_requeue_order(&mut self, before: &[String], lane: Option<usize>) -> Outcome {
        let reroute = lane.is_none();
        let wait = match lane {
            None => &self.snap.reroute,
            Some(l) => &self.snap.lanes[l],
        };
        let at = (0..=wait.len().saturating_sub(before.len())).find(|&k| wait[k..].starts_with(before));
        let Some(k) = at else {
            return Err(format!(
                "the sweep changed {} other than by adding at its ends",
                if reroute { "`reroute`" } else { "`wait`" }
            ));
        };
        let mut front = wait[..k].to_vec();
        let mut back = wait[k + before.len()..].to_vec();
        front.sort();
        back.sort();
        let all: Vec<String> = front.into_iter().chain(before.iter().cloned()).chain(back).collect();
        if all != *wait {
            match lane {
                None => {
                    replace_list(&mut self.con, &self.keys.reroute(), &all).await?;
                    self.snap.reroute = all;
                }
                Some(l) => {
                    replace_list(&mut self.con, &self.keys.lane_wait(super::operators::KINDS[l]), &all).await?;
                    self.snap.lanes[l] = all;
                    self.snap.wait = self.snap.lanes.concat();
                }
            }
        }
        Ok(())
    }
}
