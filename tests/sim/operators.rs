//! The dispatcher's and the operators' steps: dispatch (ids reused after cancel and clean, after
//! clean of an ended task, after retention), cancel, retry, clean (older than 0), pause and
//! resume, and retention expiry (the task's keys vanish, its `finished`/`expiring` entries stay).

use std::time::Duration;

use redis::AsyncCommands;
use shardctl_common::control;
use shardctl_common::model::TaskSpec;
use shardctl_common::ring::Strategy;
use shardctl_common::scripts;
use shardctl_common::{Error, ScriptCode};

use super::model::{State, TaskModel, Term};
use super::world::World;
use super::Outcome;

/// The kinds of the simulated tasks: executors serve one, the other or every kind.
pub const KINDS: [&str; 2] = ["sim", "sim2"];

impl World {
    /// A dispatcher submits a small task under a random id of the pool.
    pub async fn dispatch(&mut self) -> Outcome {
        let id = self.ids[self.rng.below(self.ids.len())].clone();
        self.dispatch_id(&id).await
    }

    /// An operator runs task `id` again from scratch, as README advises after Redis lost data:
    /// cancel it (if it runs), clean, dispatch the id again. Each part is checked.
    pub async fn redo(&mut self, id: &str) -> Outcome {
        if self.model.tasks.get(id).is_some_and(|t| !t.state.ended()) {
            self.cancel(id).await?;
            self.settle().await?;
        }
        self.clean().await?;
        self.settle().await?;
        self.dispatch_id(id).await
    }

    /// A dispatcher submits a small task under `id`.
    pub async fn dispatch_id(&mut self, id: &str) -> Outcome {
        let id = id.to_owned();
        let taken = self.model.tasks.contains_key(&id);
        self.model.nonce += 1;
        let nonce = self.model.nonce;
        let kind = KINDS[self.rng.below(KINDS.len())];
        let mut spec = TaskSpec::new(id.as_str(), kind, self.rng.range(1, 12));
        spec.attempts = self.rng.range(1, 3) as u32;
        spec.payload = format!("{{\"n\":{nonce}}}");
        // a retention that never runs out by itself: `expire_task` plays it out
        spec.retain = self.rng.chance(30).then(|| Duration::from_secs(600));
        // fair sharing (fairness.rs): some tasks in a group, some capped, weights 1 to 3
        if self.rng.chance(40) {
            spec.group = Some(super::fairness::GROUPS[self.rng.below(2)].to_owned());
        }
        if self.rng.chance(40) {
            spec.max_running = Some(self.rng.range(1, 3));
        }
        spec.weight = self.rng.range(1, 3) as u32;
        // fail-fast (docs/design/failure-policies.md): some tasks fail once 1 or 2 shards failed
        if self.rng.chance(30) {
            spec.max_failures = Some(shardctl_common::failure::Threshold::Count(self.rng.range(0, 2)));
        }
        // k-of-n: some tasks settle once some of their shards completed
        if self.rng.chance(25) {
            spec.success_when = Some(shardctl_common::failure::Threshold::Count(self.rng.range(1, spec.shards)));
        }
        if self.rng.chance(50) {
            spec.strategy = [Strategy::ConsistentHash, Strategy::RoundRobin, Strategy::HashMod][self.rng.below(3)];
        }
        let routed = spec.strategy != Strategy::Pull;
        // backups of stragglers (docs/design/speculation.md): some pull tasks, at most 1 or 2;
        // the `straggle` step ages their first attempts past the threshold
        if !routed && self.rng.chance(40) {
            spec.speculate = Some(shardctl_common::failure::Threshold::Count(self.rng.range(1, 3)));
            // enough shards to measure 5 before the last ones straggle; mostly without a cap of
            // held shards (a capped task gets no backup)
            spec.shards = spec.shards.max(8);
            if self.rng.chance(75) {
                spec.max_running = None;
            }
        }
        // a routed dispatch: the coordinator's, or one cut short (the task created, part placed)
        let cut = routed && self.rng.chance(30);
        let r = if routed && !cut {
            self.dispatch_routed(&spec).await?
        } else {
            scripts::dispatch(&mut self.con, &self.keys, &spec).await
        };
        self.note(format!(
            "dispatch {id} ({} shards, {} attempts, retain {:?}, {}{}, dispatch {nonce}): {r:?}",
            spec.shards,
            spec.attempts,
            spec.retain,
            spec.strategy.as_str(),
            if cut { " cut short" } else { "" }
        ));
        match (taken, r) {
            (true, Err(Error::Script(ScriptCode::TaskExists))) => Ok(()),
            (true, Err(Error::Refused { code: ScriptCode::TaskExists, .. })) if routed && !cut => Ok(()),
            (false, Ok(())) => {
                let seq: u64 = self.con.hget(self.keys.task(&id), "seq").await.map_err(|e| format!("HGET seq: {e}"))?;
                ensure!(
                    seq > self.model.last_seq,
                    "dispatch of {id} got incarnation {seq} after {}",
                    self.model.last_seq
                );
                self.model.last_seq = seq;
                let mut tm = TaskModel::new(seq, spec.shards, spec.attempts, nonce, spec.retain.is_some());
                tm.strategy = spec.strategy;
                tm.kind = spec.kind.clone();
                tm.max_failures = spec.max_failures.map(|m| m.of(spec.shards));
                tm.success_when = spec.success_when.map(|m| m.at_least(spec.shards));
                tm.speculate = spec.speculate.map(|m| m.at_least(spec.shards));
                let shards = spec.shards;
                tm.spec = routed.then_some(spec);
                self.model.tasks.insert(id.clone(), tm);
                self.model.stale_entries.remove(&id);
                if cut {
                    let n = self.rng.range(0, shards);
                    self.route_part(&id, n).await?;
                } else {
                    // dispatch prints the id once its records are durable
                    self.confirm_slot();
                }
                Ok(())
            }
            (taken, r) => Err(format!("dispatch of {id} (taken: {taken}) answered {r:?}")),
        }
    }

    /// An operator cancels task `id`.
    pub async fn cancel(&mut self, id: &str) -> Outcome {
        let pre = format!("{id}:");
        let held = self.snap.active.keys().filter(|r| r.starts_with(&pre)).count() as u64;
        let state = self.model.tasks.get(id).map(|t| t.state);
        let r = control::cancel(&mut self.con, &self.keys, id).await;
        self.note(format!("cancel {id} ({state:?}): {r:?}"));
        match (state, r) {
            (None, Err(Error::NoTask(_))) => Ok(()),
            (Some(s), Err(Error::Refused { code: ScriptCode::TaskEnded, .. })) if s.ended() => Ok(()),
            (Some(s), Ok(n)) if !s.ended() => {
                ensure!(n == held, "cancel of {id} stopped {n} shards, {held} were held");
                let tm = self.model.tasks.get_mut(id).expect("cancelled task");
                tm.state = State::Cancelled;
                tm.ends += 1;
                Ok(())
            }
            (s, r) => Err(format!("cancel of {id} in state {s:?} answered {r:?}")),
        }
    }

    /// An operator retries task `id`'s failed shards (or its failed aggregation).
    pub async fn retry(&mut self, id: &str) -> Outcome {
        // a halted task also runs again its shards handed out (below its cursor) and unfinished
        let bound = self.snap.tasks.get(id).map_or(0, |v| {
            if v.hash.get("strategy").is_some_and(|s| s != "pull") {
                v.num("routed")
            } else {
                v.num("cursor")
            }
        });
        let expected = self.model.tasks.get(id).map(|tm| {
            // a settled task runs again only a failed aggregation
            if tm.settled {
                return (tm.state, u64::from(tm.state == State::Failed));
            }
            let failed = tm.count(Term::Failed);
            let unfinished =
                if tm.halted { (0..bound).filter(|&i| tm.terminal[i as usize].is_none()).count() as u64 } else { 0 };
            (tm.state, if failed + unfinished > 0 { failed + unfinished } else { u64::from(tm.state == State::Failed) })
        });
        // an operator's retry may reopen an ended task: its end is no longer a promise
        if let Some(p) = &mut self.durable {
            p.reopened(id);
        }
        let r = shardctl_common::retry::retry(&mut self.con, &self.keys, id).await;
        self.note(format!("retry {id} ({expected:?}): {r:?}"));
        match (expected, r) {
            (None, Err(Error::NoTask(_))) => Ok(()),
            (Some((State::Cancelled, _)), Err(Error::Refused { code: ScriptCode::TaskEnded, .. })) => Ok(()),
            // a task that met its success_when met its goal: nothing to retry but its aggregation
            (Some((s, _)), Err(Error::Refused { code: ScriptCode::Settled, .. }))
                if s != State::Failed && self.model.tasks.get(id).is_some_and(|t| t.settled) =>
            {
                Ok(())
            }
            (Some((State::Failed, 1)), Ok(1)) if self.model.tasks.get(id).is_some_and(|t| t.settled) => {
                let tm = self.model.tasks.get_mut(id).expect("retried task");
                tm.state = State::Aggregating;
                tm.rounds += 1;
                tm.agg_fails = 0;
                Ok(())
            }
            (Some((s, want)), Ok(n)) if s != State::Cancelled => {
                ensure!(n == want, "retry of {id} ({s:?}) sent {n} again, the model expects {want}");
                let tm = self.model.tasks.get_mut(id).expect("retried task");
                if tm.halted {
                    // the limit counts anew; its unfinished shards were requeued
                    tm.halted = false;
                    for i in 0..tm.total as usize {
                        if tm.terminal[i] == Some(Term::Failed) {
                            tm.terminal[i] = None;
                        }
                        if tm.terminal[i].is_none() {
                            tm.fails[i] = 0;
                        }
                    }
                    tm.state = State::Running;
                } else if tm.count(Term::Failed) > 0 {
                    for i in 0..tm.total as usize {
                        if tm.terminal[i] == Some(Term::Failed) {
                            tm.terminal[i] = None;
                            tm.fails[i] = 0;
                        }
                    }
                    // an aggregation queued or running is void
                    tm.agg_fails = 0;
                    tm.state = State::Running;
                } else if n == 1 {
                    tm.state = State::Aggregating;
                    tm.rounds += 1;
                    tm.agg_fails = 0;
                }
                Ok(())
            }
            (e, r) => Err(format!("retry of {id} (model {e:?}) answered {r:?}")),
        }
    }

    /// An operator removes every ended task (`clean --older-than 0s`): no key of one is left.
    pub async fn clean(&mut self) -> Outcome {
        let ended: Vec<String> =
            self.model.tasks.iter().filter(|(_, t)| t.state.ended()).map(|(i, _)| i.clone()).collect();
        let stale: Vec<String> = self.model.stale_entries.iter().cloned().collect();
        let want = (ended.len() + stale.len()) as u64;
        let r = control::clean(&mut self.con, &self.keys, Some(Duration::ZERO)).await;
        self.note(format!("clean: ended {ended:?}, expired {stale:?}: {r:?}"));
        let n = r.map_err(|e| format!("clean: {e}"))?;
        ensure!(n == want, "clean removed {n} tasks, the model expects {want} ({ended:?} and expired {stale:?})");
        for id in ended.iter().chain(&stale) {
            self.model.tasks.remove(id);
            let base = self.keys.task(id);
            for pattern in [base.clone(), format!("{base}:*")] {
                let left: Vec<String> = self.con.keys(&pattern).await.map_err(|e| format!("KEYS: {e}"))?;
                ensure!(left.is_empty(), "cleaned task {id} left {left:?}");
            }
        }
        self.model.stale_entries.clear();
        Ok(())
    }

    /// An operator pauses the queue, or resumes it.
    pub async fn pause_or_resume(&mut self) -> Outcome {
        let meta = self.keys.meta();
        let r: redis::RedisResult<()> = if self.model.paused {
            self.con.hdel(&meta, "paused").await
        } else {
            self.con.hset(&meta, "paused", 1).await
        };
        r.map_err(|e| format!("pause: {e}"))?;
        self.model.paused = !self.model.paused;
        self.note(format!("paused = {}", self.model.paused));
        Ok(())
    }

    /// The retention of an ended task runs out: its keys vanish (as their PEXPIRE would make
    /// them), its entries in `finished`, `expiring` and `index` stay until a clean or a dispatch.
    pub async fn expire_task(&mut self) -> Outcome {
        let due: Vec<String> =
            self.model.tasks.iter().filter(|(_, t)| t.retain && t.state.ended()).map(|(i, _)| i.clone()).collect();
        let Some(id) = (!due.is_empty()).then(|| due[self.rng.below(due.len())].clone()) else {
            self.note("no task to expire".into());
            return Ok(());
        };
        let () = self.con.del(&self.keys.task_keys(&id)[..]).await.map_err(|e| format!("DEL: {e}"))?;
        self.note(format!("retention of {id} runs out"));
        self.model.tasks.remove(&id);
        self.model.stale_entries.insert(id);
        Ok(())
    }
}
