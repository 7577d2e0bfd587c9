//! The executors' steps: claim (its reply possibly lost), report an outcome (its reply possibly
//! lost, so that it is reported again later), release, heartbeat, give back unknown shards, and
//! lose the lease. Each predicts the script's answer from the last snapshot and the model, and a
//! different answer is a violation.

use std::collections::HashSet;

use shardctl_common::failure::Failure;
use shardctl_common::model::Job;
use shardctl_common::scripts::{self, ClaimRequest, Claimed, Finished, FinishedAs};
use shardctl_common::ScriptCode;

use redis::AsyncCommands;

use super::clock::wait_past;
use super::executor::{instance_of, Held};
use super::model::{State, TaskModel, Term};
use super::world::{World, LOCK_MS};
use super::Outcome;

/// A batch script's per-item answer as the script returns it.
fn code_of(c: &Result<i64, ScriptCode>) -> i64 {
    match c {
        Ok(n) => *n,
        Err(ScriptCode::LockMissing) => -1,
        Err(ScriptCode::LockMismatch) => -2,
        Err(ScriptCode::TaskMissing) => -3,
        Err(other) => panic!("unexpected refusal {other:?}"),
    }
}

impl World {
    /// The holder check of complete, fail and release: `Some(-1|-2)` unless `c` holds its shard,
    /// as its first attempt or its backup.
    fn holder_code(&self, c: &Claimed) -> Option<i64> {
        let r = c.shard_ref.to_string();
        if self.snap.holds(&r, &c.token) {
            return None;
        }
        Some(if self.snap.active.contains_key(&r) { -2 } else { -1 })
    }

    /// True when attempt `c` of a shard with two attempts may go alone while the other runs on
    /// (a failure to retry, a release: `leave_attempt` in lua/include/speculate.lua): `c` is
    /// the backup, or the first attempt of a shard whose backup's holder has a live lease.
    fn other_runs_on(&self, c: &Claimed) -> bool {
        match self.snap.backups.get(&c.shard_ref.to_string()) {
            None => false,
            Some(b) => *b == c.token || self.snap.alive(b),
        }
    }

    /// What complete (`fail` false) or fail (of class `class`) must answer for `c`.
    fn expected_code(&self, c: &Claimed, fail: bool, class: Failure) -> i64 {
        let last = matches!(class, Failure::Permanent | Failure::FailTask);
        if let Some(code) = self.holder_code(c) {
            return code;
        }
        if fail && !last && self.other_runs_on(c) {
            // one of two attempts fails: it goes, the other runs on, nothing recorded
            return 2;
        }
        let Some(tm) = self.model.tasks.get(&c.shard_ref.task).filter(|tm| tm.inc == c.shard_ref.seq) else {
            return -3;
        };
        match (c.shard_ref.job, fail) {
            (Job::Shard(i), _) if i >= tm.total => -3,
            (Job::Shard(i), false) => i64::from(tm.terminal[i as usize].is_none()),
            (Job::Shard(i), true) if !last && tm.fails[i as usize] + 1 < tm.attempts => 2,
            (Job::Shard(i), true) => i64::from(tm.terminal[i as usize].is_none()),
            (Job::Aggregate, true) if !last && tm.agg_fails + 1 < tm.attempts => 2,
            (Job::Aggregate, _) => i64::from(tm.state == State::Aggregating),
        }
    }

    /// Checks one shard a claim handed out under `token`.
    fn check_claimed(&self, c: &Claimed, token: &str, seen: &mut HashSet<String>) -> Outcome {
        let r = c.shard_ref.to_string();
        ensure!(seen.insert(r.clone()), "one claim handed out {r} twice");
        ensure!(c.token == token, "claim of {token} returned {r} under {}", c.token);
        if c.backup {
            return self.check_backup(c, token);
        }
        if let Some(t) = self.snap.active.get(&r) {
            return Err(format!("claim by {token} handed out {r}, held by {t}"));
        }
        let Some(tm) = self.model.tasks.get(&c.shard_ref.task) else {
            return Err(format!("claim handed out {r}: no task {} exists", c.shard_ref.task));
        };
        ensure!(
            tm.inc == c.shard_ref.seq,
            "claim handed out {r} of incarnation {}, task {} is incarnation {}",
            c.shard_ref.seq,
            c.shard_ref.task,
            tm.inc
        );
        match c.shard_ref.job {
            Job::Shard(i) => {
                ensure!(i < tm.total, "claim handed out {r}, past the task's {} shards", tm.total);
                ensure!(tm.state == State::Running, "claim handed out {r} of a task {:?}", tm.state);
                ensure!(tm.terminal[i as usize].is_none(), "claim handed out {r}, already terminal");
                let fails = tm.fails[i as usize];
                ensure!(c.fails == fails, "claim of {r} says {} failed attempts, the model counts {fails}", c.fails);
            }
            Job::Aggregate => {
                ensure!(tm.state == State::Aggregating, "claim handed out {r} of a task {:?}", tm.state);
                ensure!(c.fails == tm.agg_fails, "claim of {r} says {} fails, the model {}", c.fails, tm.agg_fails);
            }
        }
        Ok(())
    }

    /// Checks a backup attempt a claim handed out under `token` (docs/design/speculation.md,
    /// "When a shard gets a backup"): of a held first attempt of another executor's, with no
    /// backup yet, of a running pull task with `--speculate` below its cap, no cap of held
    /// shards, every index handed out. (Which straggler gets one depends on the server's clock:
    /// the claim may pick any that qualifies, or none.)
    fn check_backup(&self, c: &Claimed, token: &str) -> Outcome {
        let r = c.shard_ref.to_string();
        let Some(first) = self.snap.active.get(&r) else {
            return Err(format!("claim by {token} started a backup of {r}, which nobody holds"));
        };
        ensure!(
            instance_of(first) != instance_of(token),
            "claim by {token} started a backup of {r} on the executor of its first attempt {first}"
        );
        if let Some(b) = self.snap.backups.get(&r) {
            return Err(format!("claim by {token} started a second backup of {r}, which has {b}"));
        }
        let tm = self.model.tasks.get(&c.shard_ref.task).filter(|tm| tm.inc == c.shard_ref.seq);
        let Some(tm) = tm else { return Err(format!("a backup of {r}: not the current incarnation")) };
        let Job::Shard(i) = c.shard_ref.job else { return Err(format!("a backup of aggregation job {r}")) };
        ensure!(
            tm.state == State::Running && !tm.routed(),
            "a backup of {r} of a task {:?} ({:?})",
            tm.state,
            tm.strategy
        );
        ensure!(i < tm.total && tm.terminal[i as usize].is_none(), "a backup of {r}: terminal or past the total");
        let cap = tm.speculate.unwrap_or(0);
        ensure!(tm.spec_started < cap, "a backup of {r}: its task started {} of at most {cap}", tm.spec_started);
        let view = &self.snap.tasks[&c.shard_ref.task];
        ensure!(view.num("cursor") == tm.total, "a backup of {r} before its task handed out every index");
        ensure!(!view.hash.contains_key("max_running"), "a backup of {r} of a task with a cap of held shards");
        let fails = tm.fails[i as usize];
        ensure!(c.fails == fails, "backup of {r} says {} failed attempts, the model counts {fails}", c.fails);
        Ok(())
    }

    /// Executor `e` claims up to `count` shards; with `lost` the reply never reaches it (the
    /// shards stay held under its lease, unknown to it, until it gives them back).
    pub async fn claim(&mut self, e: usize, count: usize, lost: bool) -> Outcome {
        self.retries_due().await?;
        let seq = self.execs[e].next_seq();
        let inst = self.execs[e].instance.clone();
        let node = self.execs[e].node.clone();
        let token = format!("{inst}:{seq}");
        let served = self.execs[e].served.clone();
        let req = ClaimRequest {
            count,
            lock_ms: LOCK_MS,
            instance: &inst,
            seq,
            node: &node,
            ahead: 0,
            speeds: None,
            kinds: &served,
        };
        let out = scripts::claim(&mut self.con, &self.keys, &req).await.map_err(|e| format!("claim: {e}"))?;
        let refs: Vec<String> = out.shards.iter().map(|c| c.shard_ref.to_string()).collect();
        let backups = out.shards.iter().filter(|c| c.backup).count();
        let how = match (lost, backups) {
            (true, 0) => " (reply lost)".to_owned(),
            (true, n) => format!(" (reply lost, {n} backup)"),
            (false, 0) => String::new(),
            (false, n) => format!(" ({n} backup)"),
        };
        self.note(format!("{token} claims {count}{how}: {refs:?} paused={} lapsed={}", out.paused, out.lease_lapsed));
        if self.rebalancing {
            let (pre, lists) = (self.snap.clone(), self.snap.lists.clone());
            self.check_lists_untouched(&lists).await?;
            // the checks below compare with the state before the claim
            self.snap = pre;
        }
        if self.model.paused {
            ensure!(out.paused && out.shards.is_empty(), "a claim on the paused queue returned {refs:?}");
            return Ok(());
        }
        ensure!(!out.paused, "a claim says paused, the queue is not");
        ensure!(out.shards.len() <= count, "asked for {count}, got {refs:?}");
        let mut seen = HashSet::new();
        for c in &out.shards {
            self.check_claimed(c, &token, &mut seen)?;
            let kind = &self.model.tasks[&c.shard_ref.task].kind;
            ensure!(served.serves(kind), "{token}, serving {served}, claimed {} of kind {kind}", c.shard_ref);
        }
        for c in out.shards.iter().filter(|c| c.backup) {
            self.model.tasks.get_mut(&c.shard_ref.task).expect("checked").spec_started += 1;
        }
        // backups come only after every first attempt a claim could take
        let firsts = out.shards.iter().filter(|c| !c.backup).count();
        ensure!(
            firsts == out.shards.len() || out.shards[firsts..].iter().all(|c| c.backup),
            "a claim handed out a first attempt after a backup: {refs:?}"
        );
        if !out.shards.is_empty() {
            let had = self.snap.leases[&inst];
            ensure!(out.lease_lapsed != had, "claim says lapsed={}, the lease existed={had}", out.lease_lapsed);
        }
        if firsts < count {
            // what it passed over, read after it (the checks above read the state before it)
            self.refresh().await;
            self.check_none_passed_over(&served)?;
        }
        if lost {
            // the executor saw its claim call fail: it compares every token at its next beat
            self.execs[e].need_check = true;
            return Ok(());
        }
        if out.lease_lapsed {
            self.execs[e].need_check = true;
        }
        if out.shards.iter().any(|c| c.shard_ref.job == Job::Aggregate) {
            // the aggregator starts only once its claim is durable
            self.confirm_slot();
        }
        for c in out.shards {
            let r = c.shard_ref.clone();
            let full = super::cache::full_id(&c.task_inc);
            let Some(spec) = self.execs[e].cache.get(&mut self.con, &self.keys, &r.task, r.seq, full).await else {
                return Err(format!("{inst} finds no spec for {r}, which it just claimed"));
            };
            let tm = &self.model.tasks[&r.task];
            ensure!(
                spec.inc == r.seq && spec.nonce == tm.nonce,
                "{inst} would run {r} (incarnation {}, dispatch {}) with the spec of incarnation {} (dispatch {})",
                r.seq,
                tm.nonce,
                spec.inc,
                spec.nonce
            );
            self.execs[e].held.push(Held { claim: c, spec, reported: false });
        }
        Ok(())
    }

    /// Waits until every retry waiting out its backoff (0 to 5 ms) is due, so that which ones a
    /// claim promotes does not depend on how fast the steps ran: a seed replays step for step.
    /// Retries still wait in `delayed` between their failure and the next claim, where cancel,
    /// retry and the sweep meet them.
    async fn retries_due(&mut self) -> Outcome {
        if self.snap.delayed.is_empty() {
            return Ok(());
        }
        let last: Vec<(String, u64)> =
            self.con.zrange_withscores(self.keys.delayed(), -1, -1).await.map_err(|e| format!("ZRANGE: {e}"))?;
        if let Some((_, due)) = last.first() {
            wait_past(&mut self.con, &self.keys, *due).await?;
        }
        Ok(())
    }

    /// Executor `e` reports its `j`-th shard: completed, or failed with a retry after `delay`
    /// ms. With `lost` the reply never arrives: it keeps the shard and reports it again later.
    pub async fn report(&mut self, e: usize, j: usize, delay: Option<u64>, lost: bool) -> Outcome {
        let h = &self.execs[e].held[j];
        let (claim, spec, again) = (h.claim.clone(), h.spec, h.reported);
        let r = claim.shard_ref.to_string();
        // a failure is mostly plain; some are permanent, a few fail their task
        // (docs/design/failure-policies.md)
        let class = match (delay, self.rng.below(10)) {
            (None, _) => Failure::Retry,
            (Some(_), 0) => Failure::FailTask,
            (Some(_), 1 | 2) => Failure::Permanent,
            _ => Failure::Retry,
        };
        let expected = self.expected_code(&claim, delay.is_some(), class);
        // one of two attempts that failed to retry goes alone: nothing recorded
        let left = delay.is_some()
            && class == Failure::Retry
            && self.holder_code(&claim).is_none()
            && self.other_runs_on(&claim);
        let result = match claim.shard_ref.job {
            Job::Shard(i) => TaskModel::result(spec.inc, spec.nonce, i),
            Job::Aggregate => TaskModel::agg_result(spec.inc, spec.nonce),
        };
        let outcome = match delay {
            None => FinishedAs::Completed(&result),
            Some(delay_ms) => FinishedAs::Failed { delay_ms, reason: "boom", failure: class },
        };
        let items = [Finished { claim: &claim, outcome, ran_ms: None }];
        let node = &self.execs[e].node;
        let codes =
            scripts::finish(&mut self.con, &self.keys, node, &items).await.map_err(|e| format!("finish: {e}"))?;
        let got = code_of(&codes[0]);
        let what = match delay {
            None => "completes".to_owned(),
            Some(d) => format!("fails ({}, retry in {d} ms)", class.name()),
        };
        let how = match (again, lost) {
            (true, _) => " again (its first reply was lost)",
            (false, true) => " (reply lost)",
            _ => "",
        };
        self.note(format!("{} {what} {r}{how}: {got}", claim.token));
        ensure!(got == expected, "{} {what} {r}{how}: code {got}, the model expects {expected}", claim.token);
        if !left {
            self.apply_report(&claim, delay.is_some(), got, class);
        }
        if let (Some(p), false, None, 1) = (&mut self.durable, lost, delay, got) {
            // the executor forgets a completion (the task's result, for the aggregation) only
            // once it is durable
            match claim.shard_ref.job {
                Job::Shard(i) => p.completed(&claim.shard_ref.task, spec.nonce, i),
                Job::Aggregate => {
                    let ended = self.model.tasks[&claim.shard_ref.task].state;
                    p.result(&claim.shard_ref.task, spec.nonce, ended)
                }
            }
        }
        if lost {
            self.execs[e].held[j].reported = true;
        } else {
            self.execs[e].held.remove(j);
        }
        Ok(())
    }

    /// What an accepted complete or fail did to the model.
    fn apply_report(&mut self, c: &Claimed, fail: bool, code: i64, class: Failure) {
        if code < 0 {
            return;
        }
        let tm = self.model.tasks.get_mut(&c.shard_ref.task).expect("accepted: the task exists");
        match (c.shard_ref.job, fail, code) {
            (Job::Shard(i), false, 1) => tm.complete(i),
            (Job::Shard(i), true, 2) => tm.fails[i as usize] += 1,
            (Job::Shard(i), true, 1) if tm.halts_on_failure(class == Failure::FailTask) => tm.fail_and_halt(i),
            (Job::Shard(i), true, 1) => tm.set_terminal(i, Term::Failed),
            (Job::Shard(i), _, _) => tm.fails[i as usize] = 0,
            (Job::Aggregate, true, 2) => tm.agg_fails += 1,
            (Job::Aggregate, failed, 1) => tm.end_aggregation(!failed),
            (Job::Aggregate, _, _) => tm.agg_fails = 0,
        }
    }

    /// Executor `b` gives back one shard, or all it holds (shutdown).
    pub async fn release(&mut self, b: usize, all: bool) -> Outcome {
        let n = if all { self.execs[b].held.len() } else { 1 };
        let start = self.rng.below(self.execs[b].held.len() - n + 1);
        let gone: Vec<Held> = self.execs[b].held.drain(start..start + n).collect();
        let claims: Vec<&Claimed> = gone.iter().map(|h| &h.claim).collect();
        // item by item: a ref released by an earlier item of the call is missing for a later one
        // (the same ref twice, under two tokens, after a rollback gave an older claim back); of a
        // shard with two attempts, the one released goes and the other runs on (a backup whose
        // holder's lease is not live is dropped instead of taking over)
        let (mut active, mut backups) = (self.snap.active.clone(), self.snap.backups.clone());
        let expected: Vec<i64> = claims
            .iter()
            .map(|c| {
                let r = c.shard_ref.to_string();
                if backups.get(&r) == Some(&c.token) {
                    backups.remove(&r);
                } else if active.get(&r) == Some(&c.token) {
                    match backups.remove(&r) {
                        Some(b) if self.snap.alive(&b) => active.insert(r, b),
                        _ => active.remove(&r),
                    };
                } else {
                    return if active.contains_key(&r) { -2 } else { -1 };
                }
                1
            })
            .collect();
        let got: Vec<i64> = scripts::release(&mut self.con, &self.keys, &claims)
            .await
            .map_err(|e| format!("release: {e}"))?
            .iter()
            .map(code_of)
            .collect();
        let refs: Vec<String> = claims.iter().map(|c| c.shard_ref.to_string()).collect();
        self.note(format!("{} releases {refs:?}: {got:?}", self.execs[b].instance));
        ensure!(got == expected, "release of {refs:?}: codes {got:?}, the model expects {expected:?}");
        Ok(())
    }

    /// Executor `e`'s heartbeat, comparing its tokens when `check` (or when it must).
    pub async fn heartbeat(&mut self, e: usize, check: bool) -> Outcome {
        let ex = &self.execs[e];
        let inst = ex.instance.clone();
        let pairs = ex.pairs();
        let check = check || ex.need_check;
        let compared = check || !self.snap.leases[&inst] || self.snap.cancels != ex.cancels;
        let beat = scripts::extend(&mut self.con, &self.keys, &inst, LOCK_MS, &pairs, check, &ex.cancels)
            .await
            .map_err(|e| format!("extend: {e}"))?;
        let mut lost: Vec<usize> = beat.lost.iter().chain(&beat.cancelled).copied().collect();
        lost.sort_unstable();
        let expected: Vec<usize> = if compared {
            (0..pairs.len()).filter(|&p| !self.snap.holds(&pairs[p].0, &pairs[p].1)).collect()
        } else {
            Vec::new()
        };
        let lost_refs: Vec<&String> = lost.iter().map(|&p| &pairs[p].0).collect();
        self.note(format!("{inst} heartbeat check={check}: lost {lost_refs:?}"));
        ensure!(lost == expected, "{inst}'s heartbeat lost {lost:?} of {pairs:?}, the model expects {expected:?}");
        ensure!(
            beat.cancels == self.snap.cancels,
            "heartbeat says cancels={}, meta {}",
            beat.cancels,
            self.snap.cancels
        );
        let ex = &mut self.execs[e];
        for &p in lost.iter().rev() {
            ex.held.remove(p);
        }
        ex.cancels = beat.cancels;
        ex.need_check = false;
        // every shard it goes on running is its own (but those whose report it lost track of)
        for h in ex.held.iter().filter(|h| !h.reported) {
            let r = h.claim.shard_ref.to_string();
            let holder = self.snap.active.get(&r);
            ensure!(
                self.snap.holds(&r, &h.claim.token),
                "after its heartbeat {inst} goes on running {r} under {}, which Redis gives to {holder:?}",
                h.claim.token
            );
        }
        Ok(())
    }

    /// Executor `e` gives back what `active` holds under its instance that it does not know.
    pub async fn disown(&mut self, e: usize) -> Outcome {
        let inst = self.execs[e].instance.clone();
        let mine: HashSet<(String, String)> = self.execs[e].pairs().into_iter().collect();
        let mut unknown: Vec<(String, String)> = self
            .snap
            .active
            .iter()
            .chain(&self.snap.backups)
            .filter(|(_, t)| instance_of(t) == inst)
            .map(|(r, t)| (r.clone(), t.clone()))
            .filter(|p| !mine.contains(p))
            .collect();
        unknown.sort();
        let n = scripts::disown(&mut self.con, &self.keys, &unknown).await.map_err(|e| format!("disown: {e}"))?;
        self.note(format!("{inst} disowns {unknown:?}: {n}"));
        ensure!(n == unknown.len() as u64, "disown of {unknown:?} gave back {n}");
        Ok(())
    }

    /// A held first attempt of a task with `--speculate` straggles: its claim time in
    /// `speculating` moves an hour back, as if it had run that long, so that a claim with a free
    /// slot may start its backup (docs/design/speculation.md). (A first attempt may also pass
    /// the threshold's 500 ms floor by the clock alone: a seed whose steps are slow may then
    /// replay with other backups.)
    pub async fn straggle(&mut self) -> Outcome {
        let listed: Vec<String> =
            self.con.zrange(self.keys.speculating(), 0, -1).await.map_err(|e| format!("ZRANGE speculating: {e}"))?;
        if listed.is_empty() {
            self.note("nothing straggles".to_owned());
            return Ok(());
        }
        let r = &listed[self.rng.below(listed.len())];
        let now =
            shardctl_common::time::server_now_ms(&mut self.con, &self.keys).await.map_err(|e| format!("TIME: {e}"))?;
        let back = now.saturating_sub(3_600_000);
        let () = redis::cmd("ZADD")
            .arg(self.keys.speculating())
            .arg("XX")
            .arg(back)
            .arg(r)
            .query_async(&mut self.con)
            .await
            .map_err(|e| format!("ZADD speculating: {e}"))?;
        self.note(format!("{r} straggles (claimed an hour ago)"));
        Ok(())
    }

    /// Executor `e`'s lease runs out (it froze past its lock duration), or, one time in four, its
    /// entry vanishes (lost with a failed-over server's data).
    pub async fn expire_lease(&mut self, e: usize) -> Outcome {
        let inst = self.execs[e].instance.clone();
        if self.rng.below(4) == 0 {
            let () = self.con.zrem(self.keys.leases(), &inst).await.map_err(|e| format!("ZREM lease: {e}"))?;
            self.note(format!("{inst}'s lease entry vanishes"));
        } else {
            let () = self.con.zadd(self.keys.leases(), &inst, 1).await.map_err(|e| format!("ZADD lease: {e}"))?;
            self.note(format!("{inst}'s lease expires"));
        }
        Ok(())
    }
}
