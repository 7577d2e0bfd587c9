//! What the bench reads from Redis itself: CPU time, memory and per-command call counts from
//! `INFO`, a clean database between runs, the scripts loaded before anything is timed, and a
//! waiter that polls a task's state cheaply.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use redis::aio::ConnectionLike;
use shardctl_common::scripts::scripts;
use shardctl_common::Home;

/// One reading of `INFO cpu memory commandstats`.
#[derive(Debug, Clone)]
pub(crate) struct Info {
    /// `used_cpu_user + used_cpu_sys`, seconds.
    pub cpu_s: f64,
    /// `used_memory`, bytes.
    pub used_memory: u64,
    /// Command name → `calls` (subcommands as `config|resetstat`).
    pub calls: BTreeMap<String, u64>,
    pub at: Instant,
}

/// What Redis did between two readings.
#[derive(Debug, Clone)]
pub(crate) struct Delta {
    pub cpu_us: f64,
    pub secs: f64,
    pub calls: BTreeMap<String, u64>,
}

impl Info {
    pub fn parse(text: &str) -> Info {
        let mut info = Info { cpu_s: 0.0, used_memory: 0, calls: BTreeMap::new(), at: Instant::now() };
        for line in text.lines() {
            let Some((k, v)) = line.trim_end().split_once(':') else { continue };
            match k {
                "used_cpu_user" | "used_cpu_sys" => info.cpu_s += v.parse::<f64>().unwrap_or(0.0),
                "used_memory" => info.used_memory = v.parse().unwrap_or(0),
                _ => {
                    if let Some(name) = k.strip_prefix("cmdstat_") {
                        let calls = v.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|c| c.parse().ok());
                        info.calls.insert(name.to_owned(), calls.unwrap_or(0));
                    }
                }
            }
        }
        info
    }

    pub fn since(&self, before: &Info) -> Delta {
        let calls = self
            .calls
            .iter()
            .map(|(k, &v)| (k.clone(), v.saturating_sub(before.calls.get(k).copied().unwrap_or(0))))
            .filter(|(_, v)| *v > 0)
            .collect();
        Delta {
            cpu_us: (self.cpu_s - before.cpu_s).max(0.0) * 1e6,
            secs: self.at.duration_since(before.at).as_secs_f64(),
            calls,
        }
    }
}

/// The bench's own reading commands, left out of every count.
fn is_measurement(name: &str) -> bool {
    name == "info" || name.starts_with("config")
}

impl Delta {
    /// Every command Redis executed, those run inside scripts included (they are counted under
    /// their own names), without the bench's `INFO` and `CONFIG` calls.
    pub fn commands(&self) -> u64 {
        self.calls.iter().filter(|(k, _)| !is_measurement(k)).map(|(_, v)| v).sum()
    }
    /// Script calls (`EVALSHA`, and `EVAL` had a script been missing).
    pub fn scripts(&self) -> u64 {
        ["evalsha", "eval", "evalsha_ro", "eval_ro"].iter().map(|c| self.of(c)).sum()
    }
    pub fn of(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

pub(crate) async fn info<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<Info> {
    let text: String = redis::cmd("INFO").arg("cpu").arg("memory").arg("commandstats").query_async(con).await?;
    Ok(Info::parse(&text))
}

/// One `INFO <section>` field.
async fn field<C: ConnectionLike + Send>(con: &mut C, section: &str, name: &str) -> anyhow::Result<String> {
    let text: String = redis::cmd("INFO").arg(section).query_async(con).await?;
    text.lines()
        .find_map(|l| l.trim_end().strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(str::to_owned))
        .with_context(|| format!("INFO {section} has no {name}"))
}

pub(crate) async fn used_memory<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<u64> {
    Ok(field(con, "memory", "used_memory").await?.parse()?)
}

pub(crate) async fn redis_version<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<String> {
    field(con, "server", "redis_version").await
}

pub(crate) async fn reset_stats<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<()> {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(con).await?;
    Ok(())
}

/// Redis 7 keeps a latency histogram per command, allocated at the command's first call after
/// `CONFIG RESETSTAT` (about 24 KB each): every memory figure would show them. Turns the
/// tracking off; returns the setting to restore (None when the server has no such setting).
pub(crate) async fn latency_tracking_off<C: ConnectionLike + Send>(con: &mut C) -> Option<String> {
    let was: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("latency-tracking").query_async(con).await.ok()?;
    let was = was.get(1)?.clone();
    set_latency_tracking(con, "no").await.ok()?;
    Some(was)
}

pub(crate) async fn set_latency_tracking<C: ConnectionLike + Send>(con: &mut C, v: &str) -> anyhow::Result<()> {
    let _: () = redis::cmd("CONFIG").arg("SET").arg("latency-tracking").arg(v).query_async(con).await?;
    Ok(())
}

/// Empties the database (synchronously, so its memory is back before the next reading).
pub(crate) async fn flush<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<()> {
    let _: () = redis::cmd("FLUSHDB").arg("SYNC").query_async(con).await?;
    Ok(())
}

pub(crate) async fn dbsize<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<u64> {
    Ok(redis::cmd("DBSIZE").query_async(con).await?)
}

/// Loads every script, so that no timed call pays for a `NOSCRIPT` round trip or grows the
/// script cache.
pub(crate) async fn preload_scripts<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<()> {
    for s in scripts().all().into_iter().chain(scripts().composed()) {
        s.prepare_invoke().load_async(con).await.with_context(|| format!("loading {}", s.file()))?;
    }
    Ok(())
}

/// Clients blocked in a command (executors waiting on their marker).
pub(crate) async fn blocked_clients<C: ConnectionLike + Send>(con: &mut C) -> anyhow::Result<u64> {
    Ok(field(con, "clients", "blocked_clients").await?.parse()?)
}

/// Waits until at least `n` clients are blocked (executors waiting on their marker).
pub(crate) async fn wait_blocked<C: ConnectionLike + Send>(
    con: &mut C,
    n: u64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let blocked = blocked_clients(con).await?;
        if blocked >= n {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("{blocked} of {n} executors waiting for work after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The 1-minute load average, where /proc has it.
pub(crate) fn load_average() -> Option<String> {
    let l = std::fs::read_to_string("/proc/loadavg").ok()?;
    l.split_whitespace().next().map(str::to_owned)
}

/// How a waited-for task ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub state: String,
    pub done: u64,
    /// `HGET`/`HMGET` polls sent (to take out of the command counts).
    pub polls: u64,
    /// Highest `used_memory` sampled (every 100 ms).
    pub peak_memory: u64,
    /// When the end was seen.
    pub at: Instant,
}

/// Polls the task's `state` every `poll` until it is completed or failed, sampling
/// `used_memory` every 100 ms.
pub(crate) async fn wait_ended<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    id: &str,
    poll: Duration,
    timeout: Duration,
) -> anyhow::Result<Ended> {
    let start = Instant::now();
    let mut polls = 0u64;
    let mut peak = 0u64;
    let mut sampled = start;
    loop {
        let (state, done): (Option<String>, Option<u64>) =
            redis::cmd("HMGET").arg(home.task(id)).arg("state").arg("done").query_async(con).await?;
        polls += 1;
        let at = Instant::now();
        let state = state.with_context(|| format!("task {id} is gone"))?;
        if state == "completed" || state == "failed" {
            return Ok(Ended { state, done: done.unwrap_or(0), polls, peak_memory: peak, at });
        }
        if at.duration_since(sampled) >= Duration::from_millis(100) || polls == 1 {
            peak = peak.max(used_memory(con).await?);
            sampled = at;
        }
        if start.elapsed() > timeout {
            bail!("task {id} still {state} after {timeout:?} ({} shards done)", done.unwrap_or(0));
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info_and_takes_differences() {
        let a = Info::parse(
            "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.0\r\n\
             # Memory\r\nused_memory:1000\r\nused_memory_human:1K\r\n\
             # Commandstats\r\ncmdstat_evalsha:calls=3,usec=1\r\ncmdstat_info:calls=1,usec=1\r\n",
        );
        assert_eq!(a.used_memory, 1000);
        assert!((a.cpu_s - 1.75).abs() < 1e-9);
        let b = Info::parse(
            "used_cpu_sys:1.500000\r\nused_cpu_user:0.750000\r\nused_memory:3000\r\n\
             cmdstat_evalsha:calls=10,usec=1\r\ncmdstat_hset:calls=4,usec=1\r\ncmdstat_info:calls=5,usec=1\r\n\
             cmdstat_config|resetstat:calls=1,usec=1\r\n",
        );
        let d = b.since(&a);
        assert!((d.cpu_us - 500_000.0).abs() < 1e-3);
        assert_eq!(d.scripts(), 7);
        assert_eq!(d.commands(), 11);
        assert_eq!(d.of("hset"), 4);
    }
}
