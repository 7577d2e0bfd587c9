//! Executor processes started by the bench (this program's own `executor` command, as an
//! operator would run it) and what /proc says about them.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

use super::scenario::Ctx;

/// USER_HZ, the unit of `utime`/`stime` in /proc: 100 on every Linux (what `getconf CLK_TCK`
/// says; libc's `sysconf` would need a dependency for one constant).
const CLOCK_TICKS: f64 = 100.0;

/// Starts `shardctl executor --node-id <node> <extra>` on the bench's queue, with `--log error`
/// and every other flag at its default. Killed when dropped.
pub(crate) fn executor(ctx: &Ctx, node: &str, extra: &[&str]) -> anyhow::Result<Child> {
    Command::new(&ctx.exe)
        .args(["--redis", &ctx.url, "--prefix", &ctx.prefix, "--queue", &ctx.queue, "--log", "error"])
        .args(["executor", "--node-id", node])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting an executor process")
}

/// SIGTERM (a graceful stop: the executor leaves the membership), SIGKILL after 15 s.
pub(crate) async fn terminate(c: &mut Child) {
    if let Some(pid) = c.id() {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        if tokio::time::timeout(Duration::from_secs(15), c.wait()).await.is_ok() {
            return;
        }
    }
    let _ = c.kill().await;
}

/// The pid of a running child.
pub(crate) fn pid(c: &Child) -> anyhow::Result<u32> {
    c.id().context("the executor process has already exited")
}

/// CPU time (user + system) of process `pid` so far (`self` for this one), from
/// `/proc/<pid>/stat`; None where there is no /proc.
pub(crate) fn cpu_s(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|t| t / CLOCK_TICKS)
}

/// utime + stime, in clock ticks, of a `/proc/<pid>/stat` line.
fn parse_cpu_ticks(stat: &str) -> Option<f64> {
    // after "pid (comm) ", fields start at the state (field 3); utime and stime are 14 and 15;
    // comm may hold spaces and parentheses, hence the last ')'
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    Some(fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?)
}

/// Resident set size of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (the bench reads RSS on Linux only)"))?;
    parse_status_kib(&status, "VmRSS").map(|k| k * 1024).context("no VmRSS in /proc/<pid>/status")
}

/// A `Name:   1234 kB` line of `/proc/<pid>/status`, in KiB.
fn parse_status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (shard ctl) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(287.0));
        let status = "Name:\tshardctl\nVmPeak:\t  20000 kB\nVmRSS:\t    8356 kB\nRssAnon:\t 4000 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(8356));
        assert_eq!(parse_status_kib(status, "VmHWM"), None);
        assert!(cpu_s("self").is_some_and(|s| s >= 0.0));
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
