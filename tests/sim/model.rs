//! The reference model: what the simulator knows each task incarnation must look like in Redis
//! after every step, kept from the outcomes the scripts accepted (each checked before it is
//! applied): terminal shards and how they ended, failure counts, the task's state, and how many
//! times its aggregation was enqueued and it ended.

use std::collections::{BTreeMap, BTreeSet};

use shardctl_common::model::TaskSpec;
use shardctl_common::ring::Strategy;

/// How a shard ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// Completed (counted in `done`).
    Done,
    /// Failed for good (counted in `failed`).
    Failed,
}

/// A task's lifecycle state, as the task hash must hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Aggregating,
    Completed,
    Failed,
    Cancelled,
}

impl State {
    /// The `state` field.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Aggregating => "aggregating",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// True once the task ended.
    pub fn ended(self) -> bool {
        matches!(self, State::Completed | State::Failed | State::Cancelled)
    }
}

/// One incarnation of a task id.
#[derive(Debug, Clone)]
pub struct TaskModel {
    /// Its `seq`.
    pub inc: u64,
    pub total: u64,
    pub attempts: u32,
    /// The dispatch's nonce (its payload), so that a result tells which spec made it.
    pub nonce: u64,
    /// Dispatched with a retention (its keys get a PEXPIRE and an `expiring` entry at its end).
    pub retain: bool,
    /// How its shards are handed out; a routed task's spec is kept to resume its dispatch.
    pub strategy: Strategy,
    /// Its kind (one of `operators::KINDS`): only executors serving it may claim its shards.
    pub kind: String,
    pub spec: Option<TaskSpec>,
    pub state: State,
    pub terminal: Vec<Option<Term>>,
    /// Failed attempts per shard (`<i>:fails`), and of the aggregation job.
    pub fails: Vec<u32>,
    pub agg_fails: u32,
    /// Aggregation rounds: 1 per enqueue of the aggregation job (a retry starts another).
    pub rounds: u32,
    /// Ends (completed, failed, cancelled): at most one per round, one cancel, one per halt.
    pub ends: u32,
    /// Its `max_failures` (docs/design/failure-policies.md), if any.
    pub max_failures: Option<u64>,
    /// It halted (failed fast, or failed by a handler) and was not retried since.
    pub halted: bool,
    /// Halts: each ended it once.
    pub halts: u32,
    /// Its `success_when` (k-of-n), if any.
    pub success_when: Option<u64>,
    /// It met its `success_when`: its unfinished shards are cancelled.
    pub settled: bool,
    /// Its `--speculate` cap of backup attempts (docs/design/speculation.md), if any.
    pub speculate: Option<u64>,
    /// Backup attempts its claims started (`spec_started`).
    pub spec_started: u64,
}

impl TaskModel {
    /// A fresh incarnation.
    pub fn new(inc: u64, total: u64, attempts: u32, nonce: u64, retain: bool) -> Self {
        TaskModel {
            inc,
            total,
            attempts,
            nonce,
            retain,
            kind: String::new(),
            strategy: Strategy::Pull,
            spec: None,
            state: State::Running,
            terminal: vec![None; total as usize],
            fails: vec![0; total as usize],
            agg_fails: 0,
            rounds: 0,
            ends: 0,
            max_failures: None,
            halted: false,
            halts: 0,
            success_when: None,
            settled: false,
            speculate: None,
            spec_started: 0,
        }
    }

    /// Whether shard `idx` failing for good now (its handler's `fail_task` when `fatal`) halts the
    /// task: past its `max_failures`, or asked.
    pub fn halts_on_failure(&self, fatal: bool) -> bool {
        fatal || self.max_failures.is_some_and(|m| self.count(Term::Failed) + 1 > m)
    }

    /// Shard `idx` failed for good and the task halts (lua/include/halt.lua): it ends failed at
    /// once, and never aggregates.
    pub fn fail_and_halt(&mut self, idx: u64) {
        assert!(self.terminal[idx as usize].is_none(), "model: shard {idx} counted twice");
        self.terminal[idx as usize] = Some(Term::Failed);
        self.fails[idx as usize] = 0;
        self.halt();
    }

    /// The task halts: it ends failed at once.
    pub fn halt(&mut self) {
        self.state = State::Failed;
        self.halted = true;
        self.halts += 1;
        self.ends += 1;
    }

    /// True for a routed task (placed on node lists).
    pub fn routed(&self) -> bool {
        self.strategy != Strategy::Pull
    }

    /// Shards that ended as `t`.
    pub fn count(&self, t: Term) -> u64 {
        self.terminal.iter().filter(|x| **x == Some(t)).count() as u64
    }

    /// True when every shard is terminal.
    pub fn all_terminal(&self) -> bool {
        self.terminal.iter().all(Option::is_some)
    }

    /// Shard `idx` ended as `t` (counted once: the caller checked it was not terminal); the last
    /// one enqueues the aggregation.
    pub fn set_terminal(&mut self, idx: u64, t: Term) {
        assert!(self.terminal[idx as usize].is_none(), "model: shard {idx} counted twice");
        self.terminal[idx as usize] = Some(t);
        self.fails[idx as usize] = 0;
        if self.all_terminal() {
            self.state = State::Aggregating;
            self.rounds += 1;
        }
    }

    /// Shard `idx` completed: counted, and the task settles if that met its `success_when`
    /// while it runs (lua/include/settle.lua): its unfinished shards cancelled, its aggregation
    /// enqueued.
    pub fn complete(&mut self, idx: u64) {
        self.set_terminal(idx, Term::Done);
        if self.state == State::Running && self.success_when.is_some_and(|k| self.count(Term::Done) >= k) {
            self.settled = true;
            self.state = State::Aggregating;
            self.rounds += 1;
        }
    }

    /// Shards settling cancelled: unfinished ones of a settled task.
    pub fn cancelled(&self) -> u64 {
        if self.settled {
            self.terminal.iter().filter(|t| t.is_none()).count() as u64
        } else {
            0
        }
    }

    /// The aggregation ended (ok: its job completed); a settled task met its goal, whatever
    /// failed before.
    pub fn end_aggregation(&mut self, ok: bool) {
        let met = self.settled || self.success_when.is_some_and(|k| self.count(Term::Done) >= k);
        self.state = if ok && (self.count(Term::Failed) == 0 || met) { State::Completed } else { State::Failed };
        self.agg_fails = 0;
        self.ends += 1;
    }

    /// The result an executor running shard `idx` with this spec reports.
    pub fn result(inc: u64, nonce: u64, idx: u64) -> String {
        format!("\"{inc}:{idx}:{nonce}\"")
    }

    /// The result of the aggregation job.
    pub fn agg_result(inc: u64, nonce: u64) -> String {
        format!("\"agg:{inc}:{nonce}\"")
    }
}

/// Everything the model knows of the queue.
#[derive(Default)]
pub struct Model {
    /// The current incarnation under each id (ids absent: no task).
    pub tasks: BTreeMap<String, TaskModel>,
    /// Ids whose keys vanished (retention) while `finished`/`expiring` still list them.
    pub stale_entries: BTreeSet<String>,
    /// `meta.paused`.
    pub paused: bool,
    /// The last incarnation handed out (`meta.seq` only grows).
    pub last_seq: u64,
    /// The last dispatch nonce.
    pub nonce: u64,
}
