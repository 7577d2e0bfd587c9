//! The stalled sweep as a step: two runs (mark, then confirm), each with its throttle key
//! removed first, as if its interval had passed. Each run is checked against the snapshot before
//! it: the refs it confirms are exactly those the last run marked whose holder still has no
//! lease, each is requeued or failed for good (never lost, never left held), nothing else held
//! changes hands, and the new marks are exactly the held refs whose holder has no lease.

use std::collections::HashSet;

use redis::AsyncCommands;
use shardctl_common::model::{Part, ShardRef};
use shardctl_common::scripts::{self, STALLED_REASON};

use super::model::{State, Term};
use super::world::World;
use super::Outcome;

impl World {
    /// Two sweeps (mark, confirm), each checked.
    pub async fn sweep(&mut self) -> Outcome {
        for _ in 0..2 {
            let max_stalled = self.rng.range(0, 2) as u32;
            let pre = self.snap.clone();
            let () = self.con.del(self.keys.stalled_check()).await.map_err(|e| format!("DEL stalled-check: {e}"))?;
            let rep =
                scripts::sweep(&mut self.con, &self.keys, 1, max_stalled).await.map_err(|e| format!("sweep: {e}"))?;
            self.note(format!("sweep (max stalled {max_stalled}): {rep:?}"));
            let Some(rep) = rep else { return Err("the sweep was throttled with no throttle key".into()) };
            self.refresh().await;
            self.canonical_requeue_order(&pre.wait, false).await?;
            self.canonical_requeue_order(&pre.reroute, true).await?;
            let mut confirmed: Vec<&String> =
                pre.stalled.iter().filter(|r| pre.active.get(*r).is_some_and(|t| !pre.alive(t))).collect();
            confirmed.sort();
            let (mut recovered, mut failed) = (0, 0);
            for r in &confirmed {
                ensure!(!self.snap.active.contains_key(*r), "the sweep confirmed {r} stalled but left it held");
                let sr: ShardRef = r.parse().map_err(|e| format!("{e}"))?;
                let Some(tm) = self.model.tasks.get_mut(&sr.task).filter(|t| t.inc == sr.inc) else {
                    continue;
                };
                let view = &self.snap.tasks[&sr.task];
                let requeued = self.snap.wait.contains(*r) || self.snap.reroute.contains(*r);
                match sr.part {
                    Part::Shard(i) if view.bit(i) => {
                        ensure!(tm.terminal[i as usize].is_none(), "the sweep failed {r}, terminal already");
                        let reason = view.errors.get(&i.to_string());
                        ensure!(
                            reason.map(String::as_str) == Some(STALLED_REASON),
                            "{r} failed stalled with {reason:?}"
                        );
                        tm.set_terminal(i, Term::Failed);
                        failed += 1;
                    }
                    Part::Aggregate if view.hash.get("state").map(String::as_str) == Some("failed") => {
                        ensure!(tm.state == State::Aggregating, "the sweep failed {r} of a task {:?}", tm.state);
                        let e = view.hash.get("agg_error");
                        ensure!(e.map(String::as_str) == Some(STALLED_REASON), "{r} failed stalled with {e:?}");
                        tm.end_aggregation(false);
                        failed += 1;
                    }
                    _ => {
                        ensure!(requeued, "the sweep recovered {r} but did not requeue it");
                        recovered += 1;
                    }
                }
            }
            ensure!(
                (rep.recovered, rep.failed) == (recovered, failed),
                "sweep reports {rep:?}, the refs it confirmed ({confirmed:?}) say {recovered} recovered, {failed} failed"
            );
            let confirmed: HashSet<&String> = confirmed.into_iter().collect();
            for (r, t) in pre.active.iter().filter(|(r, _)| !confirmed.contains(r)) {
                let now = self.snap.active.get(r);
                ensure!(now == Some(t), "the sweep moved {r} from {t} to {now:?}");
            }
            let marks: HashSet<String> =
                self.snap.active.iter().filter(|(_, t)| !self.snap.alive(t)).map(|(r, _)| r.clone()).collect();
            ensure!(
                self.snap.stalled == marks,
                "the sweep marked {:?}, lease-less holders hold {marks:?}",
                self.snap.stalled
            );
            ensure!(rep.marked == marks.len() as u64, "sweep says {} marked, {} are", rep.marked, marks.len());
            self.check()?;
        }
        Ok(())
    }

    /// The sweep requeues the refs it confirms in the order of `SMEMBERS stalled`, which follows
    /// the server's random hash seed: at the back of `wait`, and the aggregation jobs of tasks
    /// whose last shard it failed at the front. Sorting what it added at either end keeps a
    /// seed's replay step for step (no order among recovered refs is promised).
    /// Likewise for `reroute` (`reroute`: true), where it puts recovered refs of routed tasks.
    async fn canonical_requeue_order(&mut self, before: &[String], reroute: bool) -> Outcome {
        let wait = if reroute { &self.snap.reroute } else { &self.snap.wait };
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
            let key = if reroute { self.keys.reroute() } else { self.keys.wait() };
            let () = redis::pipe()
                .atomic()
                .del(&key)
                .ignore()
                .rpush(&key, &all)
                .ignore()
                .query_async(&mut self.con)
                .await
                .map_err(|e| format!("reorder wait: {e}"))?;
            if reroute {
                self.snap.reroute = all;
            } else {
                self.snap.wait = all;
            }
        }
        Ok(())
    }
}
