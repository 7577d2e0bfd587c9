//! The simulated world: one queue on a real redis-server, the executors, the reference model,
//! the snapshot of Redis after the last step, and the log of the last steps. One step is one
//! actor's action, chosen by the seeded generator, followed by the invariant check.

use std::collections::{BTreeMap, VecDeque};

use shardctl_common::conn::Conn;
use shardctl_common::Home;

use super::durable::Promises;
use super::executor::Executor;
use super::failover::{rollbacks, Saved};
use super::model::Model;
use super::rng::Rng;
use super::rollback::Rollbacks;
use super::snapshot::Snapshot;
use super::Outcome;

/// Lease of the simulated executors: never runs out by itself (lease expiry is a step).
pub const LOCK_MS: u64 = 60_000;
/// Task ids in play: few, so that ids are reused all the time.
pub const IDS: usize = 5;
/// Executors.
pub const EXECUTORS: usize = 4;
/// Steps kept for the report of a failure (`SHARDCTL_SIM_LOG` sets another number).
fn log_len() -> usize {
    std::env::var("SHARDCTL_SIM_LOG").ok().and_then(|v| v.parse().ok()).unwrap_or(40)
}

pub struct World {
    pub con: Conn,
    pub keys: Home,
    pub rng: Rng,
    pub model: Model,
    pub execs: Vec<Executor>,
    pub snap: Snapshot,
    pub ids: Vec<String>,
    pub instances: Vec<String>,
    pub nodes: Vec<String>,
    pub log: VecDeque<String>,
    /// A rebalancer is re-placing live lists (`rebalancing` is set): claims leave node lists alone.
    pub rebalancing: bool,
    /// The step being taken (for the log).
    pub at: u64,
    log_len: usize,
    /// How many steps of each kind (and outcome) were taken: the coverage of a run.
    pub tally: BTreeMap<String, u64>,
    /// The slot's snapshots for the rollback fault (`failover.rs`).
    pub rb: Rollbacks<Saved>,
    /// `replica` durability (`durable.rs`): what was confirmed, which bounds the rollbacks.
    pub durable: Option<Promises>,
}

impl World {
    /// A world on an empty queue.
    pub async fn new(con: Conn, home: Home, seed: u64, durable: bool) -> Self {
        let execs: Vec<Executor> = (0..EXECUTORS).map(Executor::new).collect();
        let keys_prefix = home.prefix().to_owned();
        let mut w = World {
            con,
            keys: home,
            rng: Rng::new(seed),
            model: Model::default(),
            instances: execs.iter().map(|e| e.instance.clone()).collect(),
            nodes: execs.iter().map(|e| e.node.clone()).collect(),
            execs,
            snap: Snapshot::default(),
            ids: (0..IDS).map(|i| format!("t{i}")).collect(),
            log: VecDeque::new(),
            rebalancing: false,
            at: 0,
            log_len: log_len(),
            tally: Default::default(),
            rb: rollbacks(keys_prefix.as_str()),
            durable: durable.then(Promises::default),
        };
        // a group with a cap throughout (fairness.rs)
        let cap = shardctl_common::control::GroupChange {
            name: "gb".into(),
            max_running: Some(Some(super::fairness::GROUP_CAP)),
            weight: Some(2),
        };
        shardctl_common::control::set_groups(&mut w.con, &w.keys, &[cap]).await.expect("the group cap");
        w.refresh().await;
        if crate::ROLLBACKS {
            w.save().await.expect("the first snapshot");
        }
        w
    }

    /// Records what a step did.
    pub fn note(&mut self, s: String) {
        if self.log.len() >= self.log_len {
            self.log.pop_front();
        }
        // the kind of step: its first words without numbers ("e: claims :", "cancel t (Some(Running)):")
        let digitless: String = s.chars().filter(|c| !c.is_ascii_digit()).collect();
        let kind = digitless.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        *self.tally.entry(kind).or_default() += 1;
        self.log.push_back(format!("#{} {s}", self.at));
    }

    /// Reads Redis again.
    pub async fn refresh(&mut self) {
        self.snap = Snapshot::read(&mut self.con, &self.keys, &self.ids, &self.instances, &self.nodes).await;
    }

    /// Reads Redis again and checks every invariant.
    pub async fn settle(&mut self) -> Outcome {
        self.refresh().await;
        self.check()?;
        match &self.durable {
            Some(p) => p.check(&self.model.tasks),
            None => Ok(()),
        }
    }

    /// In `replica` durability, a confirmation now (`durable.rs`): what the slot holds is durable.
    pub fn confirm_slot(&mut self) {
        if let Some(p) = &mut self.durable {
            p.confirm();
        }
    }

    /// An executor holding something, if any.
    fn busy_executor(&mut self) -> Option<usize> {
        let busy: Vec<usize> = (0..self.execs.len()).filter(|&i| !self.execs[i].held.is_empty()).collect();
        (!busy.is_empty()).then(|| busy[self.rng.below(busy.len())])
    }

    /// A task id: mostly one with a task.
    pub fn pick_id(&mut self) -> String {
        let live: Vec<String> = self.model.tasks.keys().cloned().collect();
        if !live.is_empty() && self.rng.chance(80) {
            live[self.rng.below(live.len())].clone()
        } else {
            self.ids[self.rng.below(self.ids.len())].clone()
        }
    }

    /// One random step, then the check.
    pub async fn step(&mut self) -> Outcome {
        let resume = if self.model.paused { 10 } else { 1 };
        //          disp claim compl fail rel beat lostc disown lostr lease sweep cancel retry clean pause expire redo
        //          join leave depart rebal resume lateroute laterehome flag straggle rollback
        let rollback = u64::from(crate::ROLLBACKS);
        let weights = [8, 18, 22, 8, 3, 6, 2, 3, 3, 2, 4, 3, 3, 3, resume, 1, 3, 4, 1, 2, 5, 1, 1, 2, 1, 4, rollback];
        let action = self.rng.weighted(&weights);
        let e = self.rng.below(self.execs.len());
        let count = self.rng.range(1, 4) as usize;
        match action {
            0 => self.dispatch().await?,
            1 => self.claim(e, count, false).await?,
            2 | 3 | 4 | 8 => match self.busy_executor() {
                None => self.claim(e, count, false).await?,
                Some(b) if action == 4 => {
                    let all = self.rng.chance(30);
                    self.release(b, all).await?
                }
                Some(b) => {
                    let j = self.rng.below(self.execs[b].held.len());
                    let fail = action == 3 || (action == 8 && self.rng.chance(40));
                    let delay = fail.then(|| if self.rng.chance(50) { 0 } else { self.rng.range(1, 5) });
                    self.report(b, j, delay, action == 8).await?
                }
            },
            5 => {
                let check = self.rng.chance(30);
                self.heartbeat(e, check).await?
            }
            6 => self.claim(e, count, true).await?,
            7 => self.disown(e).await?,
            9 => self.expire_lease(e).await?,
            10 => self.sweep().await?,
            11 => {
                let id = self.pick_id();
                self.cancel(&id).await?
            }
            12 => {
                let id = self.pick_id();
                self.retry(&id).await?
            }
            13 => self.clean().await?,
            14 => self.pause_or_resume().await?,
            15 => self.expire_task().await?,
            16 => {
                let id = self.pick_id();
                self.redo(&id).await?
            }
            17 => self.join(e).await?,
            18 => self.leave(e).await?,
            19 => self.depart(e).await?,
            20 => self.rebalance().await?,
            21 => self.resume().await?,
            22 => self.stale_route().await?,
            23 => self.stale_rehome().await?,
            24 => self.flag_rebalancing().await?,
            25 => self.straggle().await?,
            _ => self.rollback().await?,
        }
        self.settle().await?;
        if crate::ROLLBACKS {
            self.save().await?;
        }
        Ok(())
    }
}

/// Replaces list `key` by `items` in one atomic step (the canonical orders of a seed's replay).
pub async fn replace_list(con: &mut Conn, key: &str, items: &[String]) -> Outcome {
    redis::pipe()
        .atomic()
        .del(key)
        .ignore()
        .rpush(key, items)
        .ignore()
        .query_async::<()>(con)
        .await
        .map_err(|e| format!("reorder {key}: {e}"))
}
