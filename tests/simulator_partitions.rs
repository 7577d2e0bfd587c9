//! The protocol simulator over partitions (docs/design/partitions.md, "The protocol
//! simulator"): seeded random executors claim, complete and fail shards in the shares of tasks
//! spread over 3 partitions of one queue, on a real redis-server with the real scripts; the
//! cross-slot report of an ended share is cut between its two slots (counted in the home, never
//! acknowledged), repeated, raced with cancel; tasks are retried, some retries cut after their
//! first step and completed by the reconciliation; leases expire and the partitions' sweeps
//! recover shards; a partition's master loses the last completion of a share already counted
//! in the home (a failover: the shard held again under its claim, the share running), and the
//! aggregation, checking every share through the real layer before and after reading it
//! (`psim/aggregate.rs`), forgets that count (`uncount.lua`) instead of aggregating, also when
//! the loss or a rollback comes in the middle of its read; what it reads must be every shard's
//! outcome, made by the home's dispatch. A quarter of the tasks drop their results at their end
//! (`--keep-results false`: `end_share.lua` in every share). Ended tasks are cleaned and their
//! ids dispatched again. A third of the tasks carry `max_failures`, a quarter of the rest a
//! `success_when`, and the home's decision pass (`partition::decide_pass`) is a step: their
//! halts and settles cross slots too (docs/design/failure-policies.md). A third of the tasks are
//! bigger and carry `--speculate`, and executor 2 is slow (it finishes a fifth as often): its
//! held shards get backup attempts on the others, a few per seed (the threshold's floor is
//! 500 ms of real time; `SHARDCTL_SIM_TALLY=1` prints how many). After every step the checks
//! below hold; at the end a drain must end every task that was not cancelled with
//! `done + failed == total` and its aggregation recorded once.
//!
//! - CI: seeds 1 to 6, 1,000 steps each. `SHARDCTL_SIM_SEED=<n>` replays one seed,
//!   `SHARDCTL_SIM_STEPS=<n>` sets the length.
//!
//! Checked after every step, for every task id with a home record:
//! - the home's `done` and `failed` are the sum of its `part:<p>` fields (each share counted
//!   once, with its final counts), and never exceed its total;
//! - a counted share exists for the same incarnation, has ended, and its counts are the ones
//!   counted (but for a share that lost writes after its count, until the aggregation forgets
//!   the count);
//! - each share's `done + failed` is the number of its terminal bits, at most its size;
//! - a backup attempt (`backups`) is always of a shard whose first attempt is held, by another
//!   executor;
//! - a home past `running` has every non-empty share counted and `done + failed == total`
//!   (with a settled task's `cancelled`; a halted task's shares are not counted);
//! - a task past its `max_failures`, or halted, never aggregates nor completes; a settled task
//!   that aggregates has met its goal;
//! - at most one aggregation job of the current incarnation is queued, held or delayed; none
//!   held or delayed once the task ended; and the aggregation was recorded at most once per
//!   incarnation;
//! - a share taken as this incarnation's (its `home_inc` the home's `inc`) is of the home's
//!   dispatch (the same payload, whose nonce no dispatch reuses), and each of its results was
//!   made by an executor running that dispatch's spec.
//!
//! The rollback fault (`ROLLBACKS`; `psim/faults.rs`, `sim/rollback.rs`): two steps in a
//! hundred, ONE slot (the home or one partition) goes back 1 to 6 steps, as an
//! asynchronous-replication failover does, while the other slots keep their state. The
//! single-slot checks above hold exactly after it; the cross-slot "counted share ended with
//! those counts" is waived for the shares of every task whose home record or share slot rolled
//! back (by that record's dispatch; a new dispatch of the id is checked in full), as for a lost
//! completion; a home rollback also restores the record of the aggregations. A third of the
//! retries that run something are followed by the home losing that retry (rolled back one
//! step: its shares run a round ahead). Executors keep
//! what they hold, and the scripts must refuse what a rolled-back slot no longer gives them.
//! The drain first lets time pass (every lease in every slot runs out, every missing share's
//! grace), so that the sweeps, the reports and the reconciliation can repair everything.

use std::collections::{BTreeMap, HashMap, HashSet};

use shardctl_common::conn::{open, Conn};
use shardctl_common::kinds::Served;
use shardctl_common::model::{Job, TaskSpec};
use shardctl_common::partition::{self, share_range, Layout};
use shardctl_common::scripts::{self, ClaimRequest, Claimed, Finished, FinishedAs, ShareReport};
use shardctl_common::{control, Home, Keys};
use shardctl_testkit::TestRedis;

#[path = "psim/aggregate.rs"]
mod aggregate;
#[path = "psim/faults.rs"]
mod faults;
#[path = "sim/rollback.rs"]
mod rollback;

/// The rollback fault (`psim/faults.rs`) in the step mix.
const ROLLBACKS: bool = true;

const K: u32 = 3;
const IDS: usize = 4;
const EXECUTORS: usize = 3;
const CI_SEEDS: u64 = 6;
const CI_STEPS: u64 = 1_000;

type Outcome = Result<(), String>;
/// A home record's state, total, done, failed and seq.
type Row = (Option<String>, Option<u64>, Option<u64>, Option<u64>, Option<u64>);

macro_rules! ensure {
    ($c:expr, $($m:tt)*) => {
        if !$c {
            return Err(format!($($m)*));
        }
    };
}

/// xorshift64*: the same steps for the same seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

/// A simulated executor: its instance (its leases), and what it holds, by keyspace (0: home,
/// p: partition p).
struct Exec {
    instance: String,
    seq: u64,
    /// Each with the result it completes with (made from the spec it read at its claim).
    held: Vec<(usize, Claimed, String)>,
}

struct Sim {
    con: Conn,
    layout: Layout,
    rng: Rng,
    execs: Vec<Exec>,
    /// (`task:round:retries`, incarnation) → aggregations recorded.
    aggregated: HashMap<(String, u64), u32>,
    /// Shares (task, partition, home record's dispatch nonce) that lost writes after their
    /// count, or whose slot or home rolled back: their count may be stale.
    lost: HashSet<(String, u32, u64)>,
    log: Vec<String>,
    /// The last dispatch nonce (a task's payload `{"n":<nonce>}`).
    nonce: u64,
    /// The slots' snapshots (rollbacks on).
    rb: Option<rollback::Rollbacks<faults::Recorded>>,
    /// Backup attempts claimed (tasks with `--speculate`).
    backups: u64,
}

impl Sim {
    fn space(&self, s: usize) -> &Keys {
        if s == 0 {
            &self.layout.home
        } else {
            &self.layout.partitions[s - 1]
        }
    }

    fn note(&mut self, s: String) {
        if self.log.len() >= 80 {
            self.log.remove(0);
        }
        self.log.push(s);
    }

    async fn step(&mut self, n: u64) -> Outcome {
        let weights: [u64; 15] = [6, 25, 25, 8, 10, 4, 3, 3, 4, 3, 1, 2, 4, 2 * u64::from(ROLLBACKS), 4];
        let total: u64 = weights.iter().sum();
        let mut pick = self.rng.next() % total;
        let mut action = 0;
        while pick >= weights[action] {
            pick -= weights[action];
            action += 1;
        }
        let e = self.rng.below(self.execs.len());
        let id = format!("t{}", self.rng.below(IDS));
        match action {
            0 => self.dispatch(&id).await,
            1 => {
                let s = self.rng.below(K as usize + 1);
                self.claim(e, s).await
            }
            // executor 2 is a slow node: it finishes a fifth as often (its shards straggle and
            // get backups on the others)
            2 | 3 if e == 2 && self.rng.chance(80) => Ok(()),
            2 | 3 => self.finish(Some(n), e, action == 3).await,
            4 => {
                let p = 1 + self.rng.below(K as usize);
                self.report(p).await
            }
            5 => self.expire(e).await,
            6 => {
                let r = control::cancel(&mut self.con, &self.layout.home, &id).await;
                self.note(format!("#{n} cancel {id}: {r:?}"));
                Ok(())
            }
            7 => {
                let r = control::clean(&mut self.con, &self.layout.home, Some(std::time::Duration::ZERO)).await;
                self.note(format!("#{n} clean: {r:?}"));
                r.map(|_| ()).map_err(|e| format!("clean: {e}"))
            }
            9 => {
                let r = shardctl_common::retry::retry(&mut self.con, &self.layout.home, &id).await;
                self.note(format!("#{n} retry {id}: {r:?}"));
                // now and then the home's master fails over to a replica that never saw the
                // retry's reopen, while the shares keep their retry (they run a round ahead)
                if ROLLBACKS && matches!(r, Ok(x) if x > 0) && self.rng.below(3) == 0 {
                    self.note(format!("#{n} the home loses the retry"));
                    return self.roll_back(n, 0, 1).await;
                }
                Ok(())
            }
            10 => self.cut_retry(&id).await,
            11 => {
                let r = shardctl_coordinator::partition::reconcile(&mut self.con, &self.layout).await;
                self.note(format!("#{n} reconcile: {r:?}"));
                r.map(|_| ()).map_err(|e| format!("reconcile: {e}"))
            }
            12 => {
                let p = 1 + self.rng.below(K as usize) as u32;
                self.lose(&id, p).await
            }
            13 => self.rollback(n).await,
            14 => self.decide(n).await,
            _ => {
                for s in 0..=K as usize {
                    let k = self.space(s).clone();
                    scripts::promote(&mut self.con, &k).await.map_err(|e| format!("promote: {e}"))?;
                }
                Ok(())
            }
        }
    }

    async fn dispatch(&mut self, id: &str) -> Outcome {
        // a third are bigger and run backups of their stragglers (docs/design/speculation.md):
        // shards held past the threshold's floor get a second attempt on another executor
        let speculate = self.rng.chance(35);
        let shards = if speculate { 15 + self.rng.below(16) as u64 } else { 1 + self.rng.below(10) as u64 };
        let mut spec = TaskSpec::new(id, "noop", shards);
        if speculate {
            spec.speculate = Some(shardctl_common::failure::Threshold::Count(6));
        }
        spec.attempts = 1 + self.rng.below(3) as u32;
        // a quarter drop their results at their end (`end_share.lua` in every share)
        spec.keep_results = !self.rng.chance(25);
        // a third fail fast past a limit, a quarter settle at a goal (decided by the home)
        if self.rng.chance(33) {
            spec.max_failures = Some(shardctl_common::failure::Threshold::Count(self.rng.below(2) as u64));
        } else if self.rng.chance(33) {
            spec.success_when =
                Some(shardctl_common::failure::Threshold::Count(1 + self.rng.below(shards as usize) as u64));
        }
        self.nonce += 1;
        spec.payload = format!("{{\"n\":{}}}", self.nonce);
        let r = shardctl_coordinator::partition::dispatch(&mut self.con, &self.layout, &spec).await;
        self.note(format!(
            "dispatch {id} ({shards} shards, {} attempts, keep results {}, max failures {:?}, success when {:?}): {r:?}",
            spec.attempts, spec.keep_results, spec.max_failures, spec.success_when
        ));
        Ok(())
    }

    async fn claim(&mut self, e: usize, s: usize) -> Outcome {
        let keys = self.space(s).clone();
        let ex = &mut self.execs[e];
        ex.seq += 1;
        let req = ClaimRequest {
            count: 1 + (ex.seq % 3) as usize,
            lock_ms: 60_000,
            instance: &ex.instance,
            seq: ex.seq,
            node: "n",
            ahead: 0,
            speeds: None,
            kinds: &Served::Every,
        };
        let out = scripts::claim(&mut self.con, &keys, &req).await.map_err(|e| format!("claim: {e}"))?;
        let refs: Vec<String> = out
            .shards
            .iter()
            .map(|c| if c.backup { format!("{} (backup)", c.shard_ref) } else { c.shard_ref.to_string() })
            .collect();
        self.backups += out.shards.iter().filter(|c| c.backup).count() as u64;
        for c in out.shards {
            // the executor runs a shard with the spec it reads now (its cache dropped)
            let result = match c.shard_ref.job {
                Job::Shard(i) if s > 0 => {
                    let p: Option<String> = redis::cmd("HGET")
                        .arg(keys.task(&c.shard_ref.task))
                        .arg("payload")
                        .query_async(&mut self.con)
                        .await
                        .map_err(|e| e.to_string())?;
                    shard_result(faults::nonce_of(p.as_ref()), i)
                }
                _ => "{}".to_owned(),
            };
            self.execs[e].held.push((s, c, result));
        }
        self.note(format!("e{e} claims in space {s}: {refs:?}"));
        Ok(())
    }

    /// Executor `e` completes (or fails) one shard it holds; `n`: the step (`None`: the drain,
    /// where nothing rolls back).
    async fn finish(&mut self, n: Option<u64>, e: usize, fail: bool) -> Outcome {
        if self.execs[e].held.is_empty() {
            return Ok(());
        }
        let j = self.rng.below(self.execs[e].held.len());
        let lost = self.rng.chance(15);
        let (s, c, result) = if lost { self.execs[e].held[j].clone() } else { self.execs[e].held.remove(j) };
        let keys = self.space(s).clone();
        if c.shard_ref.is_aggregate() && !fail && !self.aggregation_reads(&c, n).await? {
            // withdrawn: its completion would be refused
            self.execs[e].held.retain(|(_, h, _)| h.token != c.token || h.shard_ref != c.shard_ref);
            return Ok(());
        }
        let outcome = if fail {
            FinishedAs::Failed { delay_ms: 0, reason: "simulated", failure: shardctl_common::failure::Failure::Retry }
        } else {
            FinishedAs::Completed(&result)
        };
        let codes = scripts::finish(&mut self.con, &keys, "n", &[Finished { claim: &c, outcome, ran_ms: None }])
            .await
            .map_err(|e| format!("finish: {e}"))?;
        if c.shard_ref.is_aggregate() && codes.first().is_some_and(|c| matches!(c, Ok(1))) && !fail {
            let key = self.agg_key(&c.shard_ref.task, c.shard_ref.seq).await?;
            *self.aggregated.entry(key).or_default() += 1;
        }
        self.note(format!(
            "e{e} {} {} in space {s}: {codes:?}{}",
            if fail { "fails" } else { "completes" },
            c.shard_ref,
            if lost { " (reply lost)" } else { "" }
        ));
        Ok(())
    }

    /// The cross-slot report of partition `p`'s ended shares: whole, or cut after the home's
    /// count (never acknowledged: the next repeat finds it again).
    async fn report(&mut self, p: usize) -> Outcome {
        let pk = self.layout.partitions[p - 1].clone();
        if self.rng.chance(40) {
            let pending: Vec<(String, u64)> = redis::cmd("ZRANGE")
                .arg(pk.unreported())
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            for (task, _) in pending {
                // read as the executors' reporter reads it (report_share): one HMGET, and only an
                // ended share is reported (one running again after a retry has nothing to count)
                type Fields = (Option<String>, Option<u64>, Option<u64>, Option<u64>, Option<String>, Option<u64>);
                let f: Fields = redis::cmd("HMGET")
                    .arg(pk.task(&task))
                    .arg(&["home_inc", "round", "done", "failed", "state", "cancelled"])
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                let (Some(home_inc), Some(round), Some(done), Some(failed), Some("aggregating")) =
                    (f.0, f.1, f.2, f.3, f.4.as_deref())
                else {
                    continue;
                };
                let cancelled = f.5.unwrap_or(0);
                let r = ShareReport {
                    task: task.clone(),
                    home_inc,
                    partition: p as u32,
                    round,
                    done,
                    failed,
                    cancelled,
                    ..Default::default()
                };
                let got = scripts::report(&mut self.con, &self.layout.home, &r).await.map_err(|e| e.to_string())?;
                self.note(format!("report of {task} in partition {p}, cut before its ack: {got:?}"));
            }
            return Ok(());
        }
        let n = shardctl_coordinator::partition::report_pending(&mut self.con, &self.layout)
            .await
            .map_err(|e| format!("report: {e}"))?;
        self.note(format!("reports pending: {n} counted"));
        Ok(())
    }

    /// What an aggregation is recorded once for: the incarnation, and the retry round (a retry
    /// aggregates again).
    async fn agg_key(&mut self, task: &str, inc: u64) -> Result<(String, u64), String> {
        let (round, retries): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.layout.home.task(task))
            .arg("round")
            .arg("retries")
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        Ok((format!("{task}:{}:{}", round.unwrap_or(0), retries.unwrap_or(0)), inc))
    }

    /// A retry whose process dies after its first step: the home record reopened for every
    /// partition, no share retried yet (the reconciliation or the next retry completes it).
    async fn cut_retry(&mut self, id: &str) -> Outcome {
        let home = self.layout.home.clone();
        let state: Option<String> = redis::cmd("HGET")
            .arg(home.task(id))
            .arg("state")
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        if !matches!(state.as_deref(), Some("failed" | "completed" | "aggregating")) {
            return Ok(());
        }
        let parts: Vec<u32> = (1..=K).collect();
        let r = scripts::reopen(&mut self.con, &home, id, None, &parts).await;
        self.note(format!("retry of {id} cut after reopening its home: {r:?}"));
        r.map(|_| ()).map_err(|e| format!("reopen: {e}"))
    }

    /// Executor `e` dies: its leases run out, every partition's sweep recovers its shards.
    async fn expire(&mut self, e: usize) -> Outcome {
        let inst = self.execs[e].instance.clone();
        self.execs[e].held.clear();
        self.execs[e].instance = format!("{inst}x");
        for s in 0..=K as usize {
            let k = self.space(s).clone();
            let () = redis::cmd("ZADD")
                .arg(k.leases())
                .arg("XX")
                .arg(1)
                .arg(&inst)
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            scripts::sweep(&mut self.con, &k, 1, 1000).await.map_err(|e| format!("sweep: {e}"))?;
        }
        self.note(format!("e{e} dies ({inst}): its leases expire, the sweeps run"));
        Ok(())
    }

    /// A failover of partition `p`'s master loses the last completion of task `id`'s share
    /// there after the share was counted in the home: a terminal shard's bit, result or reason
    /// and count go, the share is `running` again (and out of `unreported`: the end went with
    /// it), and the shard is held again under its claim, whose executor's lease has expired.
    async fn lose(&mut self, id: &str, p: u32) -> Outcome {
        let home = self.layout.home.clone();
        let pk = self.layout.partitions[p as usize - 1].clone();
        let (counted, seq, home_state): (Option<String>, Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(home.task(id))
            .arg(format!("part:{p}"))
            .arg("inc")
            .arg("state")
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        // (once the task ended, what its shares lose changes nothing)
        if !matches!(home_state.as_deref(), Some("running" | "aggregating")) {
            return Ok(());
        }
        type Share = (Option<String>, Option<u64>, Option<String>, Option<u64>, Option<u64>);
        let (state, share_inc, home_inc, size, cancelled): Share = redis::cmd("HMGET")
            .arg(pk.task(id))
            .arg(&["state", "seq", "home_inc", "total", "cancelled"])
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let (Some(_), Some(seq), Some("aggregating"), Some(inc), Some(size)) =
            (counted, seq, state.as_deref(), share_inc, size)
        else {
            return Ok(());
        };
        // a settled share's settle is its last write: a failover that loses a completion of it
        // loses the settle too, which the rollback fault models (a suffix, not a hole)
        if cancelled.is_some() {
            return Ok(());
        }
        if home_inc.as_ref() != Some(&seq) || size == 0 {
            return Ok(());
        }
        let i = self.rng.below(size as usize) as u64;
        let failed: bool = redis::cmd("HEXISTS")
            .arg(pk.errors(id))
            .arg(i)
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let dead = format!("lost{}", self.rng.next() % 1_000_000);
        let () = redis::pipe()
            .cmd("SETBIT")
            .arg(pk.terminal(id))
            .arg(i)
            .arg(0)
            .cmd("HDEL")
            .arg(pk.results(id))
            .arg(i)
            .cmd("HDEL")
            .arg(pk.errors(id))
            .arg(i)
            .cmd("HINCRBY")
            .arg(pk.task(id))
            .arg(if failed { "failed" } else { "done" })
            .arg(-1)
            .cmd("HSET")
            .arg(pk.task(id))
            .arg("state")
            .arg("running")
            .cmd("ZREM")
            .arg(pk.unreported())
            .arg(id)
            .cmd("ZADD")
            .arg(pk.leases())
            .arg(1)
            .arg(&dead)
            .cmd("HSET")
            .arg(pk.active())
            .arg(format!("{id}:{inc}:{i}"))
            .arg(format!("{dead}:1"))
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let nonce = self.home_nonce(id).await?;
        self.lost.insert((id.to_owned(), p, nonce));
        self.note(format!("partition {p}'s master loses the completion of {id} shard {i} after its count"));
        Ok(())
    }

    async fn check(&mut self) -> Outcome {
        let home = self.layout.home.clone();
        // a backup attempt is always of a shard whose first attempt is held, by another executor
        for sp in 0..=K as usize {
            let k = self.space(sp).clone();
            let backups: BTreeMap<String, String> =
                redis::cmd("HGETALL").arg(k.backups()).query_async(&mut self.con).await.map_err(|e| e.to_string())?;
            for (r, token) in &backups {
                let first: Option<String> = redis::cmd("HGET")
                    .arg(k.active())
                    .arg(r)
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                let inst = |t: &str| t.rsplit_once(':').map(|(i, _)| i.to_owned());
                ensure!(
                    first.as_deref().is_some_and(|f| inst(f) != inst(token)),
                    "space {sp}: backup {token} of {r} while its first attempt is {first:?}"
                );
            }
        }
        for i in 0..IDS {
            let id = format!("t{i}");
            let h: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(home.task(&id))
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            if h.is_empty() {
                continue;
            }
            let num = |f: &str| h.get(f).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let (total, done, failed, seq) = (num("total"), num("done"), num("failed"), num("seq"));
            // shards a settled task cancelled (k-of-n), as its shares' counts said
            let cancelled = num("cancelled");
            let halted = h.contains_key("halted");
            let state = h.get("state").cloned().unwrap_or_default();
            let nonce = faults::nonce_of(h.get("payload"));
            ensure!(done + failed <= total, "{id}: home counts {done}+{failed} past its total {total}");
            let (mut sum_d, mut sum_f, mut sum_c) = (0, 0, 0);
            for p in 1..=K {
                let pk = self.layout.partitions[p as usize - 1].clone();
                let size = share_range(p, K, total).1;
                let s: HashMap<String, String> = redis::cmd("HGETALL")
                    .arg(pk.task(&id))
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                let snum = |f: &str| s.get(f).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                let mine = !s.is_empty() && s.get("home_inc") == h.get("inc");
                if mine {
                    let bits: u64 = redis::cmd("BITCOUNT")
                        .arg(pk.terminal(&id))
                        .query_async(&mut self.con)
                        .await
                        .map_err(|e| e.to_string())?;
                    ensure!(
                        snum("done") + snum("failed") == bits,
                        "{id} share {p}: counts {}+{} but {bits} terminal bits",
                        snum("done"),
                        snum("failed")
                    );
                    ensure!(
                        bits <= size && snum("total") == size,
                        "{id} share {p}: {bits} bits, total {} for a share of {size}",
                        snum("total")
                    );
                    ensure!(
                        s.get("payload") == h.get("payload"),
                        "{id} share {p} is taken as incarnation {seq}'s (home_inc) but is of another dispatch: {:?}, its home's {:?}",
                        s.get("payload"),
                        h.get("payload")
                    );
                    let results: HashMap<String, String> = redis::cmd("HGETALL")
                        .arg(pk.results(&id))
                        .query_async(&mut self.con)
                        .await
                        .map_err(|e| e.to_string())?;
                    for (i, v) in &results {
                        let want = shard_result(nonce, i.parse().map_err(|_| format!("{id}: result field {i}"))?);
                        ensure!(
                            *v == want,
                            "{id} share {p}: shard {i}'s result {v} was not made by this dispatch ({want})"
                        );
                    }
                }
                if let Some(v) = h.get(&format!("part:{p}")) {
                    // `done/failed`, and `/cancelled` for a share settled as its home ordered
                    let n: Vec<u64> = v.split('/').map(|x| x.parse().unwrap_or(u64::MAX)).collect();
                    ensure!((2..=3).contains(&n.len()) && !n.contains(&u64::MAX), "{id}: part:{p} = {v}");
                    let (d, f, c) = (n[0], n[1], n.get(2).copied().unwrap_or(0));
                    sum_d += d;
                    sum_f += f;
                    sum_c += c;
                    // a share counted is ended with those counts (unless cleaned away since, or it
                    // lost writes after its count: the aggregation forgets the count)
                    if mine && !self.lost.contains(&(id.clone(), p, nonce)) {
                        let st = s.get("state").map(String::as_str).unwrap_or("");
                        ensure!(
                            // ended: waiting for its home, or ended as its home (end_share.lua)
                            matches!(st, "aggregating" | "completed" | "failed" | "cancelled"),
                            "{id} share {p} counted in the home while {st}"
                        );
                        ensure!(
                            (snum("done"), snum("failed"), snum("cancelled")) == (d, f, c),
                            "{id} share {p}: counted {d}/{f}/{c}, has {}/{}/{}",
                            snum("done"),
                            snum("failed"),
                            snum("cancelled")
                        );
                    }
                } else if state != "running" && state != "cancelled" && !halted && size > 0 {
                    return Err(format!("{id} is {state} but share {p} is not counted"));
                }
                // a share of a halted task stops, or ends, as its home ordered: never counted
                // afterwards, and the task never aggregates (checked below)
            }
            ensure!(
                (sum_d, sum_f, sum_c) == (done, failed, cancelled),
                "{id}: home counts {done}/{failed}/{cancelled}, its shares' {sum_d}/{sum_f}/{sum_c}"
            );
            if (state == "aggregating" || state == "completed" || state == "failed") && !halted {
                ensure!(
                    done + failed + cancelled == total,
                    "{id} {state} with {done}+{failed}+{cancelled} cancelled of {total}"
                );
            }
            // a limit holds: a task past its max_failures never aggregates nor completes
            if let Some(max) = h.get("max_failures").and_then(|m| m.parse::<u64>().ok()) {
                ensure!(
                    failed <= max || !matches!(state.as_str(), "aggregating" | "completed"),
                    "{id} {state} with {failed} failed past its limit {max}"
                );
            }
            ensure!(!halted || state != "completed", "{id} completed although halted");
            // a settled task cancelled only shards that never completed: its goal is met
            if let (Some(goal), true) = (h.get("success_when").and_then(|g| g.parse::<u64>().ok()), cancelled > 0) {
                if matches!(state.as_str(), "aggregating" | "completed") {
                    ensure!(done >= goal, "{id} {state}: settled with {done} done, its goal {goal}");
                }
            }
            // aggregation jobs of this incarnation: at most one anywhere, none once ended
            let agg = format!("{id}:{seq}:agg");
            let wait: Vec<String> = redis::cmd("LRANGE")
                .arg(home.lane_wait("noop"))
                .arg(0)
                .arg(-1)
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            let active: BTreeMap<String, String> =
                redis::cmd("HGETALL").arg(home.active()).query_async(&mut self.con).await.map_err(|e| e.to_string())?;
            let delayed: Option<f64> = redis::cmd("ZSCORE")
                .arg(home.delayed())
                .arg(&agg)
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            let jobs = wait.iter().filter(|r| **r == agg).count()
                + usize::from(active.contains_key(&agg))
                + usize::from(delayed.is_some());
            ensure!(jobs <= 1, "{id}: {jobs} aggregation jobs queued, held or delayed");
            if matches!(state.as_str(), "completed" | "failed" | "cancelled") {
                // a ref left in `wait` is dropped by the claim that meets it (stale)
                ensure!(
                    !active.contains_key(&agg) && delayed.is_none(),
                    "{id} {state} with its aggregation job held or delayed"
                );
            }
            if matches!(state.as_str(), "running" | "delayed") {
                ensure!(jobs == 0, "{id} running with an aggregation job");
            }
            let key = self.agg_key(&id, seq).await?;
            let recorded = self.aggregated.get(&key).copied().unwrap_or(0);
            ensure!(recorded <= 1, "{id} incarnation {seq}: aggregation recorded {recorded} times in one round");
            ensure!(!halted || recorded == 0, "{id} incarnation {seq}: aggregated although halted");
        }
        Ok(())
    }

    /// The decision pass of a serving process (`partition::decide_pass`), its throttle lapsed.
    async fn decide(&mut self, n: u64) -> Outcome {
        let () = redis::cmd("DEL")
            .arg(self.layout.home.decide_check())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        let r = shardctl_coordinator::partition::decide_pass(&mut self.con, &self.layout).await;
        self.note(format!("#{n} decision pass: {r:?}"));
        r.map(|_| ()).map_err(|e| format!("decide: {e}"))
    }

    /// Runs everything to its end: one executor claims and completes all there is, the reports
    /// are repeated, until every task that was not cancelled has ended.
    async fn drain(&mut self) -> Outcome {
        self.time_passes().await?;
        for e in 0..self.execs.len() {
            self.expire(e).await?;
        }
        for round in 0..200 {
            for s in 0..=K as usize {
                let k = self.space(s).clone();
                scripts::promote(&mut self.con, &k).await.map_err(|e| e.to_string())?;
                // shards held under expired leases (a failover's lost completions) come back
                scripts::sweep(&mut self.con, &k, 1, 1000).await.map_err(|e| format!("sweep: {e}"))?;
                self.claim(0, s).await?;
                while !self.execs[0].held.is_empty() {
                    self.finish(None, 0, false).await?;
                }
            }
            shardctl_coordinator::partition::report_pending(&mut self.con, &self.layout)
                .await
                .map_err(|e| e.to_string())?;
            shardctl_coordinator::partition::reconcile(&mut self.con, &self.layout).await.map_err(|e| e.to_string())?;
            self.decide(0).await?;
            self.check().await?;
            let mut open = Vec::new();
            for i in 0..IDS {
                let id = format!("t{i}");
                let st: Option<String> = redis::cmd("HGET")
                    .arg(self.layout.home.task(&id))
                    .arg("state")
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                if matches!(st.as_deref(), Some("running" | "aggregating")) {
                    open.push(id);
                }
            }
            if open.is_empty() {
                return self.final_check().await;
            }
            if round == 199 {
                // what each open task's records say, for the replay
                let mut records = Vec::new();
                for id in &open {
                    for s in 0..=K as usize {
                        let h: BTreeMap<String, String> = redis::cmd("HGETALL")
                            .arg(self.space(s).task(id))
                            .query_async(&mut self.con)
                            .await
                            .map_err(|e| e.to_string())?;
                        let keep = ["state", "total", "done", "failed", "cancelled", "round", "halted", "success_when"];
                        let h: BTreeMap<_, _> = h
                            .into_iter()
                            .filter(|(k, _)| keep.contains(&k.as_str()) || k.starts_with("part:"))
                            .collect();
                        records.push(format!("{id} in space {s}: {h:?}"));
                    }
                }
                return Err(format!("after the drain, tasks {open:?} have not ended:\n  {}", records.join("\n  ")));
            }
        }
        Ok(())
    }

    async fn final_check(&mut self) -> Outcome {
        for i in 0..IDS {
            let id = format!("t{i}");
            let (state, total, done, failed, seq): Row = redis::cmd("HMGET")
                .arg(self.layout.home.task(&id))
                .arg(&["state", "total", "done", "failed", "seq"])
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            let (halted, cancelled): (Option<String>, Option<u64>) = redis::cmd("HMGET")
                .arg(self.layout.home.task(&id))
                .arg(&["halted", "cancelled"])
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            let Some(state) = state else { continue };
            if state == "cancelled" {
                continue;
            }
            let (total, done, failed, seq) =
                (total.unwrap_or(0), done.unwrap_or(0), failed.unwrap_or(0), seq.unwrap_or(0));
            if halted.is_some() {
                // failed fast: it ended without every shard, and never aggregated (checked)
                ensure!(state == "failed", "{id} halted but {state}");
                continue;
            }
            let cancelled = cancelled.unwrap_or(0);
            ensure!(
                done + failed + cancelled == total,
                "{id} {state}: {done}+{failed}+{cancelled} cancelled of {total}"
            );
            let key = self.agg_key(&id, seq).await?;
            let n = self.aggregated.get(&key).copied().unwrap_or(0);
            // an aggregation whose reply was lost counts in Redis but not here: at most once
            ensure!(n <= 1, "{id}: aggregated {n} times");
        }
        Ok(())
    }
}

async fn run_seed(con: Conn, seed: u64, steps: u64) -> Outcome {
    let mut c = con.clone();
    let () = redis::cmd("FLUSHALL").query_async(&mut c).await.map_err(|e| e.to_string())?;
    let home = Home::new("shardctl", "psim").unwrap();
    let layout = partition::set_count(&mut c, &home, K, false).await.map_err(|e| e.to_string())?;
    let mut sim = Sim {
        con,
        layout,
        rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        execs: (0..EXECUTORS).map(|i| Exec { instance: format!("e{i}"), seq: 0, held: Vec::new() }).collect(),
        aggregated: HashMap::new(),
        lost: HashSet::new(),
        log: Vec::new(),
        nonce: 0,
        rb: None,
        backups: 0,
    };
    if ROLLBACKS {
        sim.rb = Some(faults::rollbacks(&sim));
        sim.save().await?;
    }
    let fail =
        |sim: &Sim, n: u64, e: String| format!("seed {seed}, step {n}: {e}\nlast steps:\n  {}", sim.log.join("\n  "));
    for n in 1..=steps {
        if let Err(e) = sim.step(n).await {
            return Err(fail(&sim, n, e));
        }
        if let Err(e) = sim.check().await {
            return Err(fail(&sim, n, e));
        }
        if ROLLBACKS {
            sim.save().await.map_err(|e| fail(&sim, n, e))?;
        }
    }
    sim.drain().await.map_err(|e| fail(&sim, steps + 1, e))?;
    if std::env::var_os("SHARDCTL_SIM_TALLY").is_some() {
        eprintln!("seed {seed}: {} backup attempts claimed", sim.backups);
    }
    Ok(())
}

/// The result a shard at index `i` of a share of dispatch `nonce` is completed with.
fn shard_result(nonce: u64, i: u64) -> String {
    format!("\"{nonce}:{i}\"")
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

#[tokio::test]
async fn seeded_simulation_over_partitions() {
    let redis = TestRedis::start();
    let con = open(&redis.url()).unwrap().manager().await.unwrap();
    let steps = env_u64("SHARDCTL_SIM_STEPS").unwrap_or(CI_STEPS);
    let seeds: Vec<u64> = match env_u64("SHARDCTL_SIM_SEED") {
        Some(s) => vec![s],
        None => (1..=CI_SEEDS).collect(),
    };
    for seed in seeds {
        if let Err(e) = run_seed(con.clone(), seed, steps).await {
            panic!("{e}\nreplay: SHARDCTL_SIM_SEED={seed} cargo test --test simulator_partitions");
        }
    }
}
