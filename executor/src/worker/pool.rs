//! The worker processes of one command: started when shards come (at most one per run slot,
//! since each runs one shard at a time), kept while they behave, replaced when they do not. A
//! command that fails to start (exits, or never says hello) [`FAILED_STARTS`] times in a row is
//! started again only after a pause that doubles each time up to [`MAX_PAUSE`]: a broken
//! command does not fork in a loop. A worker that said hello and then died on a shard is the
//! shard's doing (its attempt fails), not the command's: it does not count.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::child::ExecCommand;
use shardctl_common::reason::START_FAILED;

use crate::handler::ShardError;

use super::process::Worker;

/// Failed starts in a row before the pauses.
pub const FAILED_STARTS: u32 = 5;
/// The longest pause between starts of a command that keeps failing to start.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Idle workers kept at most (more run only while that many shards do).
const MAX_IDLE: usize = 256;
/// How long a request may run with no sign of life from its worker, unless configured.
pub const DEFAULT_SILENCE: Duration = Duration::from_secs(600);

/// The workers of one command.
pub struct Pool {
    cmd: ExecCommand,
    silence: Duration,
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
    /// The pool of `cmd` (its result limit is the replies' too); a request that runs for
    /// `silence` with no sign of life from its worker fails and the worker is replaced (zero:
    /// never).
    pub fn new(cmd: ExecCommand, silence: Duration) -> Self {
        Pool { cmd, silence, idle: Mutex::new(Vec::new()), deaths: Mutex::new(Deaths::default()) }
    }

    /// An idle worker, or a new one. A start goes on in a task of its own: a shard that gives
    /// up meanwhile (its timeout, a cancel) leaves the new worker to the pool, not killed.
    pub async fn take(self: &Arc<Self>, node_id: &str) -> Result<Worker, ShardError> {
        loop {
            let w = self.idle.lock().unwrap().pop();
            let Some(mut w) = w else { break };
            match w.ready().await {
                Ok(()) => return Ok(w),
                // it died or misbehaved idle: replaced, another is tried
                Err(why) => self.retire(w, &why),
            }
        }
        {
            let d = self.deaths.lock().unwrap();
            if let Some(t) = d.not_before.filter(|t| Instant::now() < *t) {
                return Err(ShardError::new(format!(
                    "{START_FAILED}the command keeps dying at start ({} times in a row; next try in {:.0?}): {}",
                    d.in_a_row,
                    t - Instant::now(),
                    d.last
                )));
            }
        }
        let (pool, node) = (self.clone(), node_id.to_owned());
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            match Worker::start(&pool.cmd, &node, pool.silence).await {
                Ok(w) => {
                    pool.deaths.lock().unwrap().started();
                    // the shard that asked gave up: the worker waits in the pool
                    if let Err(Ok(w)) = tx.send(Ok(w)) {
                        pool.give_back(w);
                    }
                }
                Err(why) => {
                    pool.failed_start(&why);
                    let _ = tx.send(Err(why));
                }
            }
        });
        match rx.await {
            Ok(Ok(w)) => Ok(w),
            Ok(Err(why)) => Err(ShardError::new(format!("{START_FAILED}{why}"))),
            Err(_) => Err(ShardError::new("the worker's start was cut short")),
        }
    }

    /// Whether starts are paused now (the command kept dying at start).
    pub fn paused(&self) -> bool {
        self.deaths.lock().unwrap().not_before.is_some_and(|t| Instant::now() < t)
    }

    /// Gives back a worker that behaved.
    pub fn give_back(&self, w: Worker) {
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < MAX_IDLE {
            idle.push(w);
        }
    }

    /// A worker that misbehaved or died on a request: dropped (its process group killed).
    pub fn died(&self, w: Worker, why: &str) {
        tracing::warn!(worker = w.pid(), "worker replaced: {why}");
        drop(w);
    }

    /// A worker whose last reply said it exits (`"retire":true`): given a moment to do so.
    pub fn let_go(&self, w: Worker) {
        tracing::debug!(worker = w.pid(), "worker retires, as its last reply said");
        tokio::spawn(w.let_go());
    }

    /// A worker that exited before it read its request: the request goes to another worker.
    /// One that never answered a request counts as a failed start (a command whose workers say
    /// hello and exit is paused like one that dies at once).
    pub fn exited_unread(&self, w: Worker, why: &str) {
        tracing::info!(worker = w.pid(), "worker replaced, its request goes to another: {why}");
        if w.answered() == 0 {
            self.failed_start(why);
        }
        drop(w);
    }

    /// A worker stopped for what happened to its request (a cancel it did not answer in time, a
    /// request cut short) or to it while idle: dropped, its process group killed.
    pub fn retire(&self, w: Worker, why: &str) {
        tracing::info!(worker = w.pid(), "worker stopped: {why}");
        drop(w);
    }

    fn failed_start(&self, why: &str) {
        let mut d = self.deaths.lock().unwrap();
        d.in_a_row += 1;
        d.last = why.to_owned();
        if d.in_a_row >= FAILED_STARTS {
            let pause = Duration::from_secs(1 << (d.in_a_row - FAILED_STARTS).min(5)).min(MAX_PAUSE);
            d.not_before = Some(Instant::now() + pause);
            tracing::error!(
                command = %self.cmd.program(),
                "worker command keeps dying at start ({} times in a row), next start in {pause:?}; its kinds are not claimed until then: {why}",
                d.in_a_row
            );
        }
    }
}

impl Deaths {
    fn started(&mut self) {
        self.in_a_row = 0;
        self.not_before = None;
    }
}
