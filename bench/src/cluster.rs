//! The `cluster` scenario (docs/design/partitions.md): a private Redis Cluster of 3
//! masters on free ports, started here (`redis-server --cluster-enabled yes`, slots assigned
//! with `CLUSTER ADDSLOTSRANGE`, no `redis-cli` needed); the same N-shard no-op task through two
//! executor processes, once on a queue of 1 partition and once of 3. For each: throughput, and
//! each master's Redis CPU per shard and share of the total (`INFO cpu` on every master).

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use shardctl_common::model::TaskSpec;
use shardctl_common::Home;
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use tokio::process::{Child, Command};

use super::scenario::{Ctx, Figures};
use super::{process, stats};

/// Masters of the cluster.
const MASTERS: usize = 3;
/// Executor processes of each run.
const EXECUTORS: usize = 2;

/// The cluster's servers, killed on drop.
struct Cluster {
    servers: Vec<Child>,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    fn url(&self) -> String {
        let seeds: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    async fn node(&self, i: usize) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.ports[i]))?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// Starts the servers, splits the slots evenly, joins them, and waits for `cluster_state:ok`.
    async fn start() -> anyhow::Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("shardctl-bench-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut c = Cluster { servers: Vec::new(), ports: Vec::new(), dir };
        for _ in 0..MASTERS {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let conf = c.dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file", conf.to_str().context("temp path")?])
                .args(["--dir", c.dir.to_str().context("temp path")?])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("cannot start redis-server: install it (apt-get install -y redis-server)")?;
            c.servers.push(child);
            c.ports.push(port);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..MASTERS {
            loop {
                if let Ok(mut con) = c.node(i).await {
                    if redis::cmd("PING").query_async::<String>(&mut con).await.is_ok() {
                        break;
                    }
                }
                ensure!(Instant::now() < deadline, "redis-server on port {} did not answer", c.ports[i]);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let per = 16384 / MASTERS;
        for i in 0..MASTERS {
            let mut con = c.node(i).await?;
            let (a, b) = (i * per, if i + 1 == MASTERS { 16383 } else { (i + 1) * per - 1 });
            let () = redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(a).arg(b).query_async(&mut con).await?;
            if i > 0 {
                let () =
                    redis::cmd("CLUSTER").arg("MEET").arg("127.0.0.1").arg(c.ports[0]).query_async(&mut con).await?;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        'wait: loop {
            for i in 0..MASTERS {
                let mut con = c.node(i).await?;
                let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut con).await?;
                if !info.contains("cluster_state:ok") || !info.contains(&format!("cluster_known_nodes:{MASTERS}")) {
                    ensure!(Instant::now() < deadline, "the bench's cluster did not form within 30s: {info}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue 'wait;
                }
            }
            return Ok(c);
        }
    }

    /// `INFO cpu` of every master: used_cpu_user + used_cpu_sys, seconds.
    async fn cpu(&self) -> anyhow::Result<Vec<f64>> {
        let mut out = Vec::new();
        for i in 0..MASTERS {
            let mut con = self.node(i).await?;
            out.push(stats::info(&mut con).await?.cpu_s);
        }
        Ok(out)
    }

    async fn flush(&self) -> anyhow::Result<()> {
        for i in 0..MASTERS {
            let mut con = self.node(i).await?;
            let () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
            let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut con).await?;
        }
        Ok(())
    }
}

/// Both runs, 1 partition then 3, on one cluster started for them.
pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let cluster = Cluster::start().await?;
    let mut f = Figures::new();
    for (k, name) in [(1u32, "k1"), (3, "k3")] {
        cluster.flush().await?;
        let r = one(ctx, &cluster, k).await.with_context(|| format!("{k} partition(s)"))?;
        for (what, v) in r {
            f.insert(figure(name, what), v);
        }
    }
    if let (Some(a), Some(b)) = (f.get("k1_shards_per_s"), f.get("k3_shards_per_s")) {
        f.insert("k3_vs_k1_throughput", b / a);
    }
    Ok(f)
}

/// The figure names of both runs, as `'static` (the table's keys).
fn figure(run: &str, what: &str) -> &'static str {
    const NAMES: &[&str] = &[
        "k1_shards_per_s",
        "k1_cpu_us_per_shard",
        "k1_max_master_share",
        "k1_master1_cpu_us_per_shard",
        "k1_master2_cpu_us_per_shard",
        "k1_master3_cpu_us_per_shard",
        "k3_shards_per_s",
        "k3_cpu_us_per_shard",
        "k3_max_master_share",
        "k3_master1_cpu_us_per_shard",
        "k3_master2_cpu_us_per_shard",
        "k3_master3_cpu_us_per_shard",
    ];
    let want = format!("{run}_{what}");
    NAMES.iter().find(|n| **n == want).copied().unwrap_or("unknown")
}

/// One run: the queue set to `k` partitions, two executor processes, N no-op shards.
async fn one(ctx: &Ctx, cluster: &Cluster, k: u32) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let n = ctx.shards;
    let endpoint = shardctl_common::conn::open(&cluster.url())?;
    let mut con = endpoint.manager().await?;
    let keys = Home::new(&ctx.prefix, &ctx.queue)?;
    shardctl_common::partition::set_count(&mut con, &keys, k, true).await?;
    let exe = &ctx.exe;
    let mut execs = Vec::new();
    for i in 0..EXECUTORS {
        execs.push(
            Command::new(exe)
                .args(["--redis", &cluster.url(), "--prefix", &ctx.prefix, "--queue", &ctx.queue, "--log", "error"])
                .args(["executor", "--node-id", &format!("bench-cluster-{i}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting an executor process")?,
        );
    }
    let measured = async {
        // every executor has joined and found nothing to do
        let deadline = Instant::now() + Duration::from_secs(30);
        while shardctl_coordinator::membership::live(&mut con, &keys).await?.len() < EXECUTORS {
            ensure!(Instant::now() < deadline, "the executors did not join within 30s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = cluster.cpu().await?;
        let spec = TaskSpec::new(new_task_id(), "noop", n);
        let start = Instant::now();
        create_task(&mut con, &keys, &spec).await?;
        let timeout = Duration::from_secs(120) + Duration::from_millis(n);
        let ended = loop {
            let (state, done): (Option<String>, Option<u64>) =
                redis::cmd("HMGET").arg(keys.task(&spec.id)).arg("state").arg("done").query_async(&mut con).await?;
            if matches!(state.as_deref(), Some("completed" | "failed")) {
                break (state.unwrap_or_default(), done.unwrap_or(0), Instant::now());
            }
            if start.elapsed() > timeout {
                bail!("task still {state:?} after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let after = cluster.cpu().await?;
        ensure!(ended.0 == "completed" && ended.1 == n, "task ended {} with {} of {n} shards done", ended.0, ended.1);
        let secs = ended.2.duration_since(start).as_secs_f64();
        let per_master: Vec<f64> = after.iter().zip(&before).map(|(a, b)| (a - b).max(0.0) * 1e6 / n as f64).collect();
        let total: f64 = per_master.iter().sum();
        let max_share = per_master.iter().cloned().fold(0.0, f64::max) / total.max(f64::MIN_POSITIVE);
        let mut out =
            vec![("shards_per_s", n as f64 / secs), ("cpu_us_per_shard", total), ("max_master_share", max_share)];
        for (i, v) in per_master.iter().enumerate() {
            out.push((["master1_cpu_us_per_shard", "master2_cpu_us_per_shard", "master3_cpu_us_per_shard"][i], *v));
        }
        Ok::<_, anyhow::Error>(out)
    }
    .await;
    for mut e in execs {
        process::terminate(&mut e).await;
    }
    measured
}
