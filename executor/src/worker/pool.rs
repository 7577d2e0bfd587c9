//! The worker processes of one command: started when shards come (at most one per run slot,
//! since each runs one shard at a time), kept while they behave, replaced when they do not. A
//! command that dies within [`FAST_DEATH`] of its start [`FAST_DEATHS`] times in a row is
//! started again only after a pause that doubles each time up to [`MAX_PAUSE`]: a broken
//! command does not fork in a loop.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::child::ExecCommand;
use crate::handler::ShardError;

use super::process::Worker;

/// A death this soon after the start is a fast death.
pub const FAST_DEATH: Duration = Duration::from_secs(1);
/// Fast deaths in a row before the pauses.
pub const FAST_DEATHS: u32 = 5;
/// The longest pause between starts of a command that keeps dying.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Idle workers kept at most (more run only while that many shards do).
const MAX_IDLE: usize = 256;

/// The workers of one command.
pub struct Pool {
    cmd: ExecCommand,
    idle: Mutex<Vec<Worker>>,
    deaths: Mutex<Deaths>,
}

#[derive(Default)]
struct Deaths {
    in_a_row: u32,
    not_before: Option<Instant>,
    last: String,
}

impl Pool {
    /// The pool of `cmd` (its result limit is the replies' too).
    pub fn new(cmd: ExecCommand) -> Self {
        Pool { cmd, idle: Mutex::new(Vec::new()), deaths: Mutex::new(Deaths::default()) }
    }

    /// An idle worker, or a new one.
    pub async fn take(&self, node_id: &str) -> Result<Worker, ShardError> {
        loop {
            let w = self.idle.lock().unwrap().pop();
            let Some(mut w) = w else { break };
            if !w.exited() {
                return Ok(w);
            }
            // it died idle: its death is counted, another is tried
            self.died(w, "exited while idle");
        }
        {
            let d = self.deaths.lock().unwrap();
            if let Some(t) = d.not_before.filter(|t| Instant::now() < *t) {
                return Err(ShardError(format!(
                    "worker command keeps dying at start ({} times in a row; next try in {:.0?}): {}",
                    d.in_a_row,
                    t - Instant::now(),
                    d.last
                )));
            }
        }
        let started = Instant::now();
        match Worker::start(&self.cmd, node_id).await {
            Ok(w) => Ok(w),
            Err(why) => {
                self.death(started.elapsed(), &why);
                Err(ShardError(why))
            }
        }
    }

    /// Gives back a worker that behaved.
    pub fn give_back(&self, w: Worker) {
        self.deaths.lock().unwrap().in_a_row = 0;
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < MAX_IDLE {
            idle.push(w);
        }
    }

    /// A worker that misbehaved or died: dropped (its process group killed); a fast death
    /// counts toward the pauses.
    pub fn died(&self, w: Worker, why: &str) {
        let age = w.started.elapsed();
        tracing::warn!(worker = w.pid(), "worker replaced: {why}");
        drop(w);
        self.death(age, why);
    }

    /// A worker stopped for what happened to its request (a cancel it did not answer in time, a
    /// request cut short): dropped, its process group killed; not a death of the command.
    pub fn retire(&self, w: Worker, why: &str) {
        tracing::info!(worker = w.pid(), "worker stopped: {why}");
        drop(w);
    }

    fn death(&self, age: Duration, why: &str) {
        let mut d = self.deaths.lock().unwrap();
        if age >= FAST_DEATH {
            d.in_a_row = 0;
            d.not_before = None;
            return;
        }
        d.in_a_row += 1;
        d.last = why.to_owned();
        if d.in_a_row >= FAST_DEATHS {
            let pause = Duration::from_secs(1 << (d.in_a_row - FAST_DEATHS).min(5)).min(MAX_PAUSE);
            d.not_before = Some(Instant::now() + pause);
            tracing::error!(
                command = %self.cmd.program(),
                "worker command keeps dying at start ({} times in a row), next start in {pause:?}: {why}",
                d.in_a_row
            );
        }
    }
}
