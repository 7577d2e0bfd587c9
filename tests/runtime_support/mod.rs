//! Set-up shared by the runtime tests: a private redis-server and one queue on it, executors
//! started on the test's runtime with small timings, the coordinator's sweep beside them, and
//! readers of what the queue holds (the `active` hash of holders, the executors' leases).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shardctl_common::conn::Conn;
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::model::{TaskInfo, TaskSpec};
use shardctl_common::{conn, scripts, Home};
use shardctl_executor::{Executor, ExecutorConfig, Registry, Stats, StatsSnapshot};
use shardctl_testkit::TestRedis;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use shardctl_coordinator::{dispatch, progress, sweep, wait};

/// Longest a test waits for anything; only there so that a broken runtime fails, not hangs.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Timings small enough for tests: a crashed holder's shards come back within a second or two.
pub fn config(node: &str) -> ExecutorConfig {
    ExecutorConfig {
        node_id: node.to_owned(),
        concurrency: 4,
        lock_duration: Duration::from_secs(1),
        lock_renew: Duration::from_millis(300),
        block_timeout: Duration::from_millis(200),
        grace: Duration::from_secs(5),
        ..ExecutorConfig::default()
    }
}

/// One private server and one queue on it.
pub struct RuntimeEnv {
    /// Killed on drop.
    pub redis: TestRedis,
    /// For the executors.
    pub endpoint: shardctl_common::conn::Endpoint,
    /// The test's own connection (cloned per call).
    pub con: Conn,
    /// The queue under test.
    pub keys: Home,
}

impl RuntimeEnv {
    /// A server that keeps nothing on disk.
    pub async fn start() -> Self {
        Self::with(TestRedis::start()).await
    }

    /// A server with an append-only file, for restarts that keep the data.
    pub async fn start_persistent() -> Self {
        Self::with(TestRedis::start_persistent()).await
    }

    async fn with(redis: TestRedis) -> Self {
        let endpoint = conn::open(&redis.url()).expect("redis endpoint");
        let con = endpoint.manager().await.expect("connection manager");
        RuntimeEnv { redis, endpoint, con, keys: Home::new("shardctl", "runtime").unwrap() }
    }

    /// Creates a task through the coordinator, panicking on any error.
    pub async fn dispatch(&self, spec: &TaskSpec) {
        let mut con = self.con.clone();
        dispatch::create_task(&mut con, &self.keys, spec)
            .await
            .unwrap_or_else(|e| panic!("dispatch of {}: {e}", spec.id));
    }

    /// Connects an executor on the current runtime and runs it until stopped.
    pub async fn executor(&self, cfg: ExecutorConfig, registry: Registry) -> Running {
        let ex = Executor::connect(self.endpoint.clone(), self.keys.clone(), cfg, registry).await.expect("connect");
        let stats = ex.stats();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(ex.run(shutdown.clone()));
        Running { stats, shutdown, handle }
    }

    /// Runs the coordinator's stalled sweep beside the executors until stopped.
    pub fn sweeper(&self, interval: Duration, max_stalled: u32) -> Sweeper {
        let stop = CancellationToken::new();
        let cfg = sweep::SweepConfig { interval, max_stalled };
        let handle = tokio::spawn(sweep::run(self.con.clone(), self.keys.clone(), cfg, stop.clone(), |_| {}));
        Sweeper { stop, handle }
    }

    /// Waits (at most [`PATIENCE`]) until the task is completed or failed.
    pub async fn wait(&self, id: &str) -> TaskInfo {
        let mut con = self.con.clone();
        let mut last = None;
        match wait::wait(&mut con, &self.keys, id, Some(PATIENCE), |t| last = Some(t.clone())).await {
            Ok(t) => t,
            Err(e) => {
                let (held, waiting, leases) = (self.holders().await, self.wait_list().await, self.leases().await);
                panic!(
                    "task {id} did not end: {e}\nlast seen: {last:?}\nheld: {held:?}\nwaiting: {waiting:?}\nleases: \
                     {leases:?}\nredis log:\n{}",
                    self.redis.log()
                )
            }
        }
    }

    /// The task now.
    pub async fn task(&self, id: &str) -> TaskInfo {
        let mut con = self.con.clone();
        progress::task(&mut con, &self.keys, id).await.expect("read task")
    }

    /// The failed shards of a task, by index, with their reasons.
    pub async fn failed_shards(&self, id: &str) -> Vec<(u64, String)> {
        let mut con = self.con.clone();
        progress::failed_shards(&mut con, &self.keys, id).await.expect("read failed shards")
    }

    /// Runs a raw command on a clone of the test's connection.
    pub async fn cmd<T: redis::FromRedisValue>(&self, c: &redis::Cmd) -> T {
        let mut con = self.con.clone();
        c.query_async(&mut con).await.unwrap_or_else(|e| panic!("{c:?} failed: {e}\nredis log:\n{}", self.redis.log()))
    }

    /// Number of shards being run (the fields of the `active` hash but its pin).
    pub async fn active(&self) -> u64 {
        self.holders().await.len() as u64
    }

    /// The shards being run, each with the token of its holder (`<instance>:<seq>`).
    pub async fn holders(&self) -> HashMap<String, String> {
        let mut h: HashMap<String, String> = self.cmd(redis::cmd("HGETALL").arg(self.keys.active())).await;
        h.remove(ACTIVE_PIN);
        h
    }

    /// Panics unless the `active` hash holds no shard: it is absent or holds only its pin.
    pub async fn assert_nothing_held(&self) {
        let fields: Vec<String> = self.cmd(redis::cmd("HKEYS").arg(self.keys.active())).await;
        assert!(fields.iter().all(|f| f == ACTIVE_PIN), "shards still held in `active`: {fields:?}");
    }

    /// The time (ms) executor `instance`'s lease has left by the server's clock; `None` when it
    /// has none or it expired.
    pub async fn lease_ttl(&self, instance: &str) -> Option<u64> {
        let mut con = self.con.clone();
        scripts::lease_left_ms(&mut con, &self.keys, instance).await.expect("reading a lease")
    }

    /// Another holder takes `shard_ref` over while executor `instance`'s lease is gone, as after
    /// the executor froze past its lock duration and a sweep recovered the shard for another.
    pub async fn take_over(&self, shard_ref: &str, instance: &str, token: &str) {
        let mut con = self.con.clone();
        let () = redis::pipe()
            .atomic()
            .hset(self.keys.active(), shard_ref, token)
            .zadd(self.keys.leases(), instance, 1)
            .query_async(&mut con)
            .await
            .expect("take over");
    }

    /// `leases`: instance → expiry (ms, the server's clock).
    pub async fn leases(&self) -> Vec<(String, u64)> {
        self.cmd(redis::cmd("ZRANGE").arg(self.keys.leases()).arg(0).arg(-1).arg("WITHSCORES")).await
    }

    /// The `wait` list, head first.
    pub async fn wait_list(&self) -> Vec<String> {
        let mut con = self.con.clone();
        shardctl_common::kinds::waiting(&mut con, &self.keys).await.unwrap()
    }

    /// Every key of the queue matching `*<part>*`, sorted.
    pub async fn keys_like(&self, part: &str) -> Vec<String> {
        let mut k: Vec<String> = self.cmd(redis::cmd("KEYS").arg(format!("*{part}*"))).await;
        k.sort();
        k
    }
}

/// An executor running on a tokio task.
pub struct Running {
    /// Its live counters.
    pub stats: Arc<Stats>,
    /// Cancelling it starts the graceful shutdown.
    pub shutdown: CancellationToken,
    handle: JoinHandle<shardctl_common::Result<StatsSnapshot>>,
}

impl Running {
    /// The counters now.
    pub fn now(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Shuts down gracefully and returns the final counters.
    pub async fn stop(self) -> StatsSnapshot {
        self.shutdown.cancel();
        self.join().await
    }

    /// Drops the run future without a shutdown (as a `select!` or a `timeout` around it would).
    pub async fn abort(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }

    /// Waits for a shutdown already under way.
    pub async fn join(self) -> StatsSnapshot {
        tokio::time::timeout(PATIENCE, self.handle)
            .await
            .expect("the executor did not stop")
            .expect("the executor task panicked")
            .expect("the executor failed")
    }
}

/// The sweep loop on a tokio task.
pub struct Sweeper {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Sweeper {
    /// Stops the loop.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

/// A runtime of its own for one executor, so that a test can kill all of it at once.
pub struct Doomed(Option<tokio::runtime::Runtime>);

impl Doomed {
    /// A small multi-thread runtime.
    pub fn new() -> Self {
        Doomed(Some(tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()))
    }

    /// Spawns `fut` on it.
    pub fn spawn<F: Future + Send + 'static>(&self, fut: F)
    where
        F::Output: Send + 'static,
    {
        self.0.as_ref().expect("not crashed yet").spawn(fut);
    }

    /// Drops every task of the runtime where it stands, without waiting: as in a crash, none of
    /// them runs again (no last heartbeat, no release, no report).
    pub fn crash(mut self) {
        self.0.take().expect("not crashed yet").shutdown_background();
    }
}

impl Drop for Doomed {
    fn drop(&mut self) {
        // dropping a runtime inside another one panics; a failing test must not abort the others
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub use shardctl_testkit::eventually_async;
