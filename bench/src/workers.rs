//! Handlers in other languages (issue 24): 2,000 shards whose handler sleeps 2 ms, at
//! concurrency 8, through (a) the built-in `sleep` kind, (b) `--exec` with a Python handler
//! (one process per shard; 200 shards, its throughput scaled), (c) `--worker` with a Python
//! handler using `clients/python`, (d) `--worker` with a Node handler using `clients/node`;
//! and 5,000 no-op shards through the built-in `noop` kind and each worker (the pure overhead
//! of a shard). One executor process per case, warmed by a task of 64 shards first (a node
//! keeps its workers from task to task); its own CPU (not its children's) per shard.
//!
//! Targets: (c) and (d) at ≥ 80% of (a)'s throughput, and the executor's CPU per shard through
//! a worker within 2× that of a built-in shard.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use shardctl_common::model::TaskSpec;
use shardctl_coordinator::dispatch::{create_task, new_task_id};

use super::scenario::{Ctx, Figures};
use super::{process, stats};

const SLEEP_SHARDS: u64 = 2_000;
const EXEC_SHARDS: u64 = 200;
const NOOP_SHARDS: u64 = 5_000;
const CONCURRENCY: &str = "8";

const PY: &str = r#"
import sys, time
sys.path.insert(0, sys.argv[1])
from shardctl_worker import serve
def handle(s):
    ms = (s.payload or {}).get("ms", 0)
    if ms:
        time.sleep(ms / 1000)
    return None
serve(handle)
"#;

const PY_EXEC: &str = r#"
import json, sys, time
ms = (json.load(sys.stdin) or {}).get("ms", 0)
time.sleep(ms / 1000)
"#;

const NODE: &str = r#"
const { serve } = require(process.argv[2]);
serve((s) => {
  const ms = (s.payload || {}).ms || 0;
  return ms ? new Promise((r) => setTimeout(() => r(null), ms)) : null;
});
"#;

/// One case: its throughput and the executor's CPU per shard.
struct Case {
    per_s: f64,
    cpu_us: f64,
}

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let dir = std::env::temp_dir().join(format!("shardctl-bench-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, body: &str| -> anyhow::Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, body)?;
        Ok(p)
    };
    let clients = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../clients"));
    let py = format!("python3 {} {}", write("w.py", PY)?.display(), clients.join("python").display());
    let node = format!("node {} {}", write("w.js", NODE)?.display(), clients.join("node").display());
    let py_exec = format!("python3 {}", write("exec.py", PY_EXEC)?.display());
    let sleep = r#"{"ms":2}"#;

    let builtin = case(ctx, &[], "sleep", sleep, SLEEP_SHARDS).await?;
    let exec = case(ctx, &["--exec", &py_exec, "--kinds", "py"], "py", sleep, EXEC_SHARDS).await?;
    let worker_py = case(ctx, &["--worker", &py, "--kinds", "py"], "py", sleep, SLEEP_SHARDS).await?;
    let worker_node = case(ctx, &["--worker", &node, "--kinds", "js"], "js", sleep, SLEEP_SHARDS).await?;
    let noop = case(ctx, &[], "noop", "null", NOOP_SHARDS).await?;
    let noop_py = case(ctx, &["--worker", &py, "--kinds", "py"], "py", "null", NOOP_SHARDS).await?;
    let noop_node = case(ctx, &["--worker", &node, "--kinds", "js"], "js", "null", NOOP_SHARDS).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Figures::from([
        ("builtin_per_s", builtin.per_s),
        ("exec_py_per_s", exec.per_s),
        ("worker_py_per_s", worker_py.per_s),
        ("worker_node_per_s", worker_node.per_s),
        ("worker_py_pct", worker_py.per_s / builtin.per_s * 100.0),
        ("worker_node_pct", worker_node.per_s / builtin.per_s * 100.0),
        ("exec_py_pct", exec.per_s / builtin.per_s * 100.0),
        ("builtin_cpu_us", builtin.cpu_us),
        ("worker_py_cpu_us", worker_py.cpu_us),
        ("worker_node_cpu_us", worker_node.cpu_us),
        ("worker_cpu_ratio", worker_py.cpu_us.max(worker_node.cpu_us) / builtin.cpu_us),
        ("noop_per_s", noop.per_s),
        ("noop_py_per_s", noop_py.per_s),
        ("noop_node_per_s", noop_node.per_s),
        ("noop_py_us", 1e6 / noop_py.per_s - 1e6 / noop.per_s),
        ("noop_node_us", 1e6 / noop_node.per_s - 1e6 / noop.per_s),
    ]))
}

/// `shards` shards of `kind` with `payload` through one executor process started with `flags`.
async fn case(ctx: &mut Ctx, flags: &[&str], kind: &str, payload: &str, shards: u64) -> anyhow::Result<Case> {
    let mut args = vec!["--concurrency", CONCURRENCY];
    args.extend_from_slice(flags);
    let mut child = process::executor(ctx, &format!("bench-workers-{kind}"), &args)?;
    let measured = async {
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
        let pid = process::pid(&child)?.to_string();
        let mut con = ctx.con.clone();
        // warm: a node keeps its workers from task to task, so their starts (8 interpreters on
        // 2 cores) are not a cost of the shards measured
        let warm = TaskSpec { payload: payload.to_owned(), attempts: 1, ..TaskSpec::new(new_task_id(), kind, 64) };
        create_task(&mut con, &ctx.keys, &warm).await?;
        stats::wait_ended(&mut con, &ctx.keys, &warm.id, Duration::from_millis(5), Duration::from_secs(120)).await?;
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
        let spec = TaskSpec { payload: payload.to_owned(), attempts: 1, ..TaskSpec::new(new_task_id(), kind, shards) };
        let cpu0 = process::cpu_s(&pid).context("reading the executor's CPU time")?;
        let start = Instant::now();
        create_task(&mut con, &ctx.keys, &spec).await?;
        let ended =
            stats::wait_ended(&mut con, &ctx.keys, &spec.id, Duration::from_millis(5), Duration::from_secs(600))
                .await?;
        let secs = ended.at.duration_since(start).as_secs_f64();
        let cpu = process::cpu_s(&pid).context("reading the executor's CPU time")? - cpu0;
        ensure!(
            ended.state == "completed" && ended.done == shards,
            "{kind} through {flags:?}: the task ended {} with {} of {shards} shards done",
            ended.state,
            ended.done
        );
        Ok::<_, anyhow::Error>(Case { per_s: shards as f64 / secs, cpu_us: cpu * 1e6 / shards as f64 })
    }
    .await;
    process::terminate(&mut child).await;
    measured
}
