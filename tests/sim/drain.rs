//! Quiescence: the queue is resumed and every executor beats (comparing its tokens), reports
//! what it holds, gives back what it does not know, and claims and completes until nothing is
//! left (the live members; a member joins if none is left); sweeps recover what lease-less
//! holders kept and rebalances place routed work. Then every task not cancelled must have ended
//! completed or failed with `done + failed == total`, nothing may be held, and no node list,
//! `reroute` or `wait` may keep a ref of a current incarnation that was not cancelled.

use std::time::Duration;

use shardctl_common::model::ShardRef;

use super::executor::Member;
use super::model::State;
use super::world::World;
use super::Outcome;

/// Rounds before the queue counts as stuck (retries come due within 5 ms of real time).
const ROUNDS: usize = 300;

impl World {
    /// Drains the queue, checking after every action.
    pub async fn drain(&mut self) -> Outcome {
        self.note("-- drain".into());
        if self.model.paused {
            self.pause_or_resume().await?;
            self.settle().await?;
        }
        if self.execs[0].member != Member::Live {
            // routed work needs a member, and every kind an executor that serves it: the first
            // executor, which serves every kind, joins
            self.join(0).await?;
            self.settle().await?;
        }
        for round in 0..ROUNDS {
            let mut claimed = false;
            for e in 0..self.execs.len() {
                self.heartbeat(e, true).await?;
                self.settle().await?;
                self.finish_all(e).await?;
                self.disown(e).await?;
                self.settle().await?;
                if self.execs[e].member != Member::Live {
                    continue;
                }
                self.claim(e, 4, false).await?;
                self.settle().await?;
                claimed |= !self.execs[e].held.is_empty();
                self.finish_all(e).await?;
            }
            self.sweep().await?;
            self.settle().await?;
            self.rebalance().await?;
            self.settle().await?;
            let idle = self.snap.active.is_empty() && self.execs.iter().all(|e| e.held.is_empty());
            if idle && self.model.tasks.values().all(|t| t.state.ended()) {
                return self.quiescent();
            }
            if !claimed && round > 2 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let open: Vec<String> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| !t.state.ended())
            .map(|(i, t)| format!("{i}:{} {:?}", t.inc, t.state))
            .collect();
        Err(format!(
            "the queue did not drain in {ROUNDS} rounds: open {open:?}, held {:?}, wait {:?}",
            self.snap.active, self.snap.wait
        ))
    }

    /// Executor `e` completes everything it holds.
    async fn finish_all(&mut self, e: usize) -> Outcome {
        while !self.execs[e].held.is_empty() {
            self.report(e, 0, None, false).await?;
            self.settle().await?;
        }
        Ok(())
    }

    fn quiescent(&self) -> Outcome {
        // no queued ref of an incarnation that still counts (cancelled ones are dropped lazily)
        let lists = self.snap.lists.iter().flat_map(|(_, l)| l);
        for r in self.snap.reroute.iter().chain(lists).chain(&self.snap.wait) {
            let sr: ShardRef = r.parse().map_err(|e| format!("queued ref {r}: {e}"))?;
            let live = self.model.tasks.get(&sr.task).is_some_and(|t| t.inc == sr.seq && t.state != State::Cancelled);
            ensure!(!live, "at quiescence {r} is still queued");
        }
        for (id, tm) in &self.model.tasks {
            let v = &self.snap.tasks[id];
            let (done, failed) = (v.num("done"), v.num("failed"));
            if tm.state != State::Cancelled {
                // a halted task ends with shards unfinished
                ensure!(
                    matches!(tm.state, State::Completed | State::Failed)
                        && (done + failed + tm.cancelled() == tm.total || tm.halted),
                    "at quiescence task {id}:{} is {:?} with {done} + {failed} of {}",
                    tm.inc,
                    tm.state,
                    tm.total
                );
            }
        }
        Ok(())
    }
}
