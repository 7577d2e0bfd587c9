//! The BullMQ comparison: `bench/bullmq/bench.js` (built into this program and written next to
//! a scratch install of `bullmq` under /tmp) run by node against the same redis-server. It
//! prints one JSON line, parsed here.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use tokio::process::Command;

use super::scenario::{Ctx, Figures};

/// Most jobs BullMQ gets (its rate is steady well before).
pub(crate) const CAP: u64 = 200_000;
/// The scratch folder `bullmq` is installed into.
const DIR: &str = "/tmp/shardctl-bullmq";
/// What npm installs (BullMQ 6 takes its Redis driver as an optional peer).
const PACKAGES: [&str; 2] = ["bullmq@6", "ioredis@5"];
const SCRIPT: &str = include_str!("../bullmq/bench.js");
/// Concurrency of BullMQ's worker.
const CONCURRENCY: u32 = 200;

/// Checks node and npm, installs `bullmq` into the scratch folder once, writes the script there.
/// Returns the script and a description of what runs it.
pub(crate) async fn prepare() -> anyhow::Result<(PathBuf, String)> {
    let node = Command::new("node").arg("--version").output().await;
    let node = node.ok().filter(|o| o.status.success()).context("node is not installed")?;
    let dir = Path::new(DIR);
    let installed = ["bullmq", "ioredis"].iter().all(|p| dir.join(format!("node_modules/{p}/package.json")).exists());
    if !installed {
        let npm = Command::new("npm").arg("--version").output().await;
        npm.ok().filter(|o| o.status.success()).context("npm is not installed")?;
        let what = PACKAGES.join(" ");
        eprintln!("installing {what} into {DIR} (once)");
        std::fs::create_dir_all(dir)?;
        let install = Command::new("npm")
            .args(["install", "--prefix", DIR, "--no-audit", "--no-fund", "--loglevel=error"])
            .args(PACKAGES)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        let status =
            tokio::time::timeout(Duration::from_secs(600), install).await.context("npm install timed out")??;
        if !status.success() {
            bail!("npm install {what} failed ({status})");
        }
    }
    let script = dir.join("bench.js");
    std::fs::write(&script, SCRIPT)?;
    let pkg = std::fs::read_to_string(dir.join("node_modules/bullmq/package.json"))?;
    let version = serde_json::from_str::<serde_json::Value>(&pkg)?["version"].as_str().unwrap_or("?").to_owned();
    let node = String::from_utf8_lossy(&node.stdout).trim().to_owned();
    Ok((script, format!("bullmq {version} on node {node}, one worker of concurrency {CONCURRENCY}")))
}

/// The line the script prints.
#[derive(Debug, Deserialize)]
struct Reply {
    jobs: u64,
    add_secs: f64,
    process_secs: f64,
    add_cpu_us: f64,
    process_cpu_us: f64,
    add_commands: u64,
    process_commands: u64,
    add_scripts: u64,
    process_scripts: u64,
    waiting_bytes: f64,
}

/// One run: `jobs` no-op jobs added in bulk, then processed by one worker.
pub(crate) async fn run(ctx: &mut Ctx, script: &Path, jobs: u64) -> anyhow::Result<Figures> {
    let child = Command::new("node")
        .arg(script)
        .env("BENCH_REDIS_URL", &ctx.url)
        .env("BENCH_REDIS_PORT", port(&ctx.url))
        .env("BENCH_JOBS", jobs.to_string())
        .env("BENCH_CONCURRENCY", CONCURRENCY.to_string())
        .env("BULLMQ_DIR", DIR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting node")?;
    let out = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
        .await
        .context("bench.js did not end within 10 minutes")??;
    if !out.status.success() {
        bail!("bench.js failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.trim_start().starts_with('{')).context("bench.js printed no JSON")?;
    let r: Reply = serde_json::from_str(line).with_context(|| format!("bench.js printed {line}"))?;
    let n = r.jobs as f64;
    Ok(Figures::from([
        ("jobs", n),
        ("add_rate", n / r.add_secs),
        ("process_rate", n / r.process_secs),
        ("cpu_us_per_job", (r.add_cpu_us + r.process_cpu_us) / n),
        ("process_cpu_us_per_job", r.process_cpu_us / n),
        ("commands_per_job", (r.add_commands + r.process_commands) as f64 / n),
        ("process_commands_per_job", r.process_commands as f64 / n),
        ("script_calls_per_job", (r.add_scripts + r.process_scripts) as f64 / n),
        ("bytes_per_job", r.waiting_bytes / n),
    ]))
}

/// The port of a `redis://host:port/...` URL (6379 when none is given).
fn port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split('/').next().unwrap_or(host);
    host.rsplit_once(':').map_or("6379", |(_, p)| p).to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn port_of_url() {
        assert_eq!(super::port("redis://127.0.0.1:41769"), "41769");
        assert_eq!(super::port("redis://:pw@host:7000/2"), "7000");
        assert_eq!(super::port("redis://host"), "6379");
    }
}
