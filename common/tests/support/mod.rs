//! Set-up shared by the script invariant tests: a private redis-server, a connection manager,
//! the queue's keys, one-item shorthands of the typed script wrappers, readers of what the
//! scripts left in Redis (the `active` hash of holders, the executors' leases), and the Redis
//! Cluster key-slot function.

use std::collections::HashMap;
use std::time::Duration;

use shardctl_common::conn::open;
use shardctl_common::conn::Conn;
use shardctl_common::failure::Failure;
use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimOutcome, ClaimRequest, Claimed, Finished, FinishedAs, SweepReport};
use shardctl_common::{Home, ScriptCode};
use shardctl_testkit::TestRedis;

/// One private server and one queue on it.
pub struct ScriptEnv {
    /// Killed on drop.
    pub redis: TestRedis,
    /// For more managers (one per concurrent task).
    pub client: shardctl_common::conn::Endpoint,
    /// The connection of the test itself.
    pub con: Conn,
    /// The queue under test.
    pub keys: Home,
}

/// One item's code from a batch script: `Ok(n ≥ 0)` or the refusal.
pub type Code = Result<i64, ScriptCode>;

/// The node id the tests claim and finish as.
pub const NODE: &str = "test-node";

/// The permanent field of the `active` hash that is not a shard (lua/include/lib.lua).
pub use shardctl_common::keys::ACTIVE_PIN;

/// The index of a claimed shard (panics on an aggregation job).
pub fn index(c: &Claimed) -> u64 {
    match c.shard_ref.job {
        shardctl_common::model::Job::Shard(i) => i,
        shardctl_common::model::Job::Aggregate => panic!("expected a shard, got the aggregation job {}", c.shard_ref),
    }
}

impl ScriptEnv {
    /// The events of the queue's log of type `kind`, each as its field map.
    #[allow(dead_code)] // used by failure_policies.rs and speculation.rs
    pub async fn events(&mut self, kind: &str) -> Vec<HashMap<String, String>> {
        let key = self.keys.events();
        let all: Vec<(String, Vec<String>)> = self.cmd(redis::cmd("XRANGE").arg(key).arg("-").arg("+")).await;
        all.into_iter()
            .map(|(_, kv)| kv.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect::<HashMap<_, _>>())
            .filter(|e| e.get("event").map(String::as_str) == Some(kind))
            .collect()
    }

    /// Starts a server and connects to it; `queue` names the queue (one per test).
    pub async fn start(queue: &str) -> Self {
        let redis = TestRedis::start();
        let client = open(&redis.url()).expect("redis client");
        let con = client.manager().await.expect("connection manager");
        ScriptEnv { redis, client, con, keys: Home::new("shardctl", queue).unwrap() }
    }

    /// Another connection manager to the same server.
    pub async fn manager(&self) -> Conn {
        self.client.manager().await.expect("connection manager")
    }

    /// Runs a raw command on the test's connection.
    pub async fn cmd<T: redis::FromRedisValue>(&mut self, c: &redis::Cmd) -> T {
        c.query_async(&mut self.con)
            .await
            .unwrap_or_else(|e| panic!("{c:?} failed: {e}\nredis log:\n{}", self.redis.log()))
    }

    /// Dispatches `spec`, panicking on any error.
    pub async fn dispatch(&mut self, spec: &TaskSpec) {
        scripts::dispatch(&mut self.con, &self.keys, spec)
            .await
            .unwrap_or_else(|e| panic!("dispatch of {}: {e}", spec.id));
    }

    /// Claims up to `count` shards as executor instance `base`, all under the one token
    /// `<base>:<seq>`; renews the lease of `<base>` for `lock_ms`.
    pub async fn claim(&mut self, base: &str, seq: u64, count: usize, lock_ms: u64) -> ClaimOutcome {
        let req = ClaimRequest {
            count,
            lock_ms,
            instance: base,
            seq,
            node: NODE,
            ahead: 0,
            speeds: None,
            kinds: &Served::Every,
        };
        scripts::claim(&mut self.con, &self.keys, &req).await.expect("claim")
    }

    /// Completes one claim with `result`.
    pub async fn complete(&mut self, c: &Claimed, result: &str) -> Code {
        let items = [Finished { claim: c, outcome: FinishedAs::Completed(result), ran_ms: None }];
        one(scripts::finish(&mut self.con, &self.keys, NODE, &items).await.expect("finish (complete)"))
    }

    /// Fails one claim with `reason`, retrying after `delay_ms` if attempts are left.
    pub async fn fail(&mut self, c: &Claimed, delay_ms: u64, reason: &str) -> Code {
        self.fail_as(c, delay_ms, reason, Failure::Retry).await
    }

    /// Fails one claim with `reason` and the class `failure` (docs/design/failure-policies.md).
    pub async fn fail_as(&mut self, c: &Claimed, delay_ms: u64, reason: &str, failure: Failure) -> Code {
        let items = [Finished { claim: c, outcome: FinishedAs::Failed { delay_ms, reason, failure }, ran_ms: None }];
        one(scripts::finish(&mut self.con, &self.keys, NODE, &items).await.expect("finish (fail)"))
    }

    /// Releases one claim.
    pub async fn release(&mut self, c: &Claimed) -> Code {
        one(scripts::release(&mut self.con, &self.keys, &[c]).await.expect("release"))
    }

    /// The heartbeat of executor `instance` holding `held`: extends its lease (checking `held`
    /// when the lease had expired); the 0-based positions of the lost shards.
    pub async fn extend(&mut self, instance: &str, held: &[&Claimed], lock_ms: u64) -> Vec<usize> {
        self.extend_checked(instance, held, lock_ms, false).await
    }

    /// The heartbeat, comparing every token when `check` (after a claim took a lapsed lease).
    pub async fn extend_checked(&mut self, instance: &str, held: &[&Claimed], lock_ms: u64, check: bool) -> Vec<usize> {
        let pairs: Vec<(String, String)> = held.iter().map(|c| (c.shard_ref.to_string(), c.token.clone())).collect();
        scripts::extend(&mut self.con, &self.keys, instance, lock_ms, &pairs, check, "0").await.expect("extend").lost
    }

    /// One stalled sweep; `None` when nothing ran (no lease expired, the full sweep throttled).
    pub async fn sweep(&mut self, interval_ms: u64, max_stalled: u32) -> Option<SweepReport> {
        scripts::sweep(&mut self.con, &self.keys, interval_ms, max_stalled).await.expect("sweep").report
    }

    /// Waits out the sweep throttle (`interval_ms` on the server clock) and sweeps.
    pub async fn sweep_after(&mut self, interval_ms: u64, max_stalled: u32) -> SweepReport {
        tokio::time::sleep(Duration::from_millis(interval_ms + 40)).await;
        self.sweep(interval_ms, max_stalled)
            .await
            .unwrap_or_else(|| panic!("sweep throttled although {interval_ms} ms passed"))
    }

    /// The task hash.
    pub async fn task(&mut self, id: &str) -> HashMap<String, String> {
        let key = self.keys.task(id);
        self.cmd(redis::cmd("HGETALL").arg(key)).await
    }

    /// A numeric field of the task hash (0 when absent).
    pub async fn count(&mut self, id: &str, field: &str) -> u64 {
        let key = self.keys.task(id);
        let v: Option<u64> = self.cmd(redis::cmd("HGET").arg(key).arg(field)).await;
        v.unwrap_or(0)
    }

    /// A text field of the task hash.
    pub async fn field(&mut self, id: &str, field: &str) -> Option<String> {
        let key = self.keys.task(id);
        self.cmd(redis::cmd("HGET").arg(key).arg(field)).await
    }

    /// The `wait` list, head first.
    pub async fn wait_list(&mut self) -> Vec<String> {
        shardctl_common::kinds::waiting(&mut self.con, &self.keys).await.unwrap()
    }

    /// The shards held in the `active` hash (its fields but the pin), sorted.
    pub async fn active(&mut self) -> Vec<String> {
        let key = self.keys.active();
        let mut refs: Vec<String> = self.cmd(redis::cmd("HKEYS").arg(key)).await;
        refs.retain(|r| r != ACTIVE_PIN);
        refs.sort();
        refs
    }

    /// The token holding `<ref>` in the `active` hash, if any.
    pub async fn holder(&mut self, shard_ref: &str) -> Option<String> {
        let key = self.keys.active();
        self.cmd(redis::cmd("HGET").arg(key).arg(shard_ref)).await
    }

    /// Makes `<ref>` held by `token`, behind the scripts' backs (another holder took it).
    pub async fn set_holder(&mut self, shard_ref: &str, token: &str) {
        let key = self.keys.active();
        self.cmd::<()>(redis::cmd("HSET").arg(key).arg(shard_ref).arg(token)).await;
    }

    /// The time (ms) executor `instance`'s lease has left by the server's clock; `None` when it
    /// has none or it expired.
    pub async fn lease_ttl(&mut self, instance: &str) -> Option<u64> {
        scripts::lease_left_ms(&mut self.con, &self.keys, instance).await.expect("reading a lease")
    }

    /// Executor `instance`'s lease runs out now (it died, or froze past its lock duration): its
    /// expiry is set in the past, where the sweep finds it.
    pub async fn drop_lease(&mut self, instance: &str) {
        let key = self.keys.leases();
        self.cmd::<()>(redis::cmd("ZADD").arg(key).arg(1).arg(instance)).await;
    }

    /// Executor `instance`'s lease entry vanishes (lost with the data of a failed-over server):
    /// only the full sweep's mark-then-confirm finds its shards.
    pub async fn remove_lease(&mut self, instance: &str) {
        let key = self.keys.leases();
        self.cmd::<()>(redis::cmd("ZREM").arg(key).arg(instance)).await;
    }

    /// `OBJECT ENCODING` of `key`.
    pub async fn encoding(&mut self, key: &str) -> String {
        self.cmd(redis::cmd("OBJECT").arg("ENCODING").arg(key)).await
    }

    /// Every key of the server, sorted.
    pub async fn all_keys(&mut self) -> Vec<String> {
        let mut k: Vec<String> = self.cmd(redis::cmd("KEYS").arg("*")).await;
        k.sort();
        k
    }

    /// Number of keys of the server.
    pub async fn dbsize(&mut self) -> u64 {
        self.cmd(&redis::cmd("DBSIZE")).await
    }
}

fn one(mut codes: Vec<Code>) -> Code {
    assert_eq!(codes.len(), 1, "one code per item: {codes:?}");
    codes.remove(0)
}

#[allow(unused_imports)] // each test file uses a part of the harness
pub use shardctl_testkit::cluster::{crc16, key_slot};
