//! The `durability` scenario (docs/design/durability.md): a private redis-server master and one
//! replica of it (`--replicaof`), started here; the `e2e` workload (N no-op pull shards, one
//! executor process with default flags) on the master twice: with the queue's durability
//! `none`, then `replica`, where the executor confirms each batch of completions with a
//! pipeline ending in `WAIT 1 <timeout>`. The replica is attached in both runs, so the only
//! difference is the mode. Figures: both throughputs, their ratio, Redis CPU and commands
//! (scripts' own included) per shard, and the master's `WAIT` calls per shard (`cmdstat_wait`
//! of `INFO commandstats` before and after).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use shardctl_common::durability::{self as mode, Durability, Mode};

use super::redis_server::RedisServer;
use super::scenario::{Ctx, Figures};
use super::{queue, stats};

/// How long the replica has to come online.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// The master and its replica, both killed on drop.
struct Pair {
    master: RedisServer,
    _replica: RedisServer,
}

impl Pair {
    /// Starts both and waits until the master's `INFO replication` shows the replica online.
    async fn start() -> anyhow::Result<Pair> {
        let master = tokio::task::spawn_blocking(RedisServer::start).await??;
        let port = master.port.to_string();
        let replica =
            tokio::task::spawn_blocking(move || RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]))
                .await??;
        let pair = Pair { master, _replica: replica };
        let mut con = redis::Client::open(pair.master.url.as_str())?.get_multiplexed_async_connection().await?;
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut con).await?;
            if replica_online(&info) {
                return Ok(pair);
            }
            ensure!(Instant::now() < deadline, "the replica did not come online within {SYNC_TIMEOUT:?}: {info}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether a master's `INFO replication` lists a replica in state `online`.
fn replica_online(info: &str) -> bool {
    info.lines().any(|l| l.starts_with("slave") && l.contains("state=online"))
}

/// Both runs, `none` then `replica`, on one pair started for them.
pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let pair = Pair::start().await.context("starting a master and its replica")?;
    let url = pair.master.url.clone();
    let endpoint = shardctl_common::conn::open(&url)?;
    let con = endpoint.manager().await?;
    let mut on = Ctx {
        url,
        endpoint,
        con,
        prefix: ctx.prefix.clone(),
        queue: ctx.queue.clone(),
        keys: ctx.keys.clone(),
        shards: ctx.shards,
        exe: ctx.exe.clone(),
    };
    stats::preload_scripts(&mut on.con).await?;
    // as on the bench's own server: no per-command histograms in the memory figures
    let _ = stats::latency_tracking_off(&mut on.con).await;
    let n = ctx.shards as f64;
    let mut f = Figures::new();
    for m in [Mode::None, Mode::Replica] {
        stats::flush(&mut on.con).await?;
        let d = Durability { mode: m, timeout: mode::DEFAULT_TIMEOUT };
        // what `shardctl config --durability` does: refuse a mode the server cannot keep now
        mode::check(&mut on.con, on.keys.keys(), &d).await?;
        mode::store(&mut on.con, &on.keys, &d).await?;
        // e2e resets the server's stats once its executor waits for work: the delta is the run's
        let (e2e, delta) =
            queue::e2e_with_delta(&mut on).await.with_context(|| format!("durability {}", m.as_str()))?;
        let read = |k: &str| e2e.get(k).copied().unwrap_or(f64::NAN);
        let waits = delta.of("wait") as f64 / n;
        let (throughput, cpu, commands, wait) = match m {
            Mode::None => {
                ("none_shards_per_s", "none_cpu_us_per_shard", "none_commands_per_shard", "none_wait_per_shard")
            }
            _ => (
                "replica_shards_per_s",
                "replica_cpu_us_per_shard",
                "replica_commands_per_shard",
                "replica_wait_per_shard",
            ),
        };
        f.insert(throughput, read("shards_per_s"));
        f.insert(cpu, read("cpu_us_per_shard"));
        f.insert(commands, read("commands_per_shard"));
        f.insert(wait, waits);
    }
    stats::flush(&mut on.con).await?;
    if let (Some(none), Some(replica)) = (f.get("none_shards_per_s"), f.get("replica_shards_per_s")) {
        f.insert("replica_vs_none", replica / none);
    }
    drop(on);
    drop(pair);
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_the_replica_online() {
        let syncing = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                       slave0:ip=127.0.0.1,port=6380,state=wait_bgsave,offset=0,lag=0\r\n";
        assert!(!replica_online(syncing));
        assert!(replica_online(&syncing.replace("wait_bgsave", "online")));
        assert!(!replica_online("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"));
    }
}
