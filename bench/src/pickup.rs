//! Pickup latency (issue 12): how soon an idle executor claims a shard dispatched while it waits.
//!
//! One executor process with default flags blocks on the queue's marker. Then, [`SAMPLES`]
//! times: a one-shard `noop` task is dispatched, and the latency is the time between the
//! `EVALSHA` of `dispatch.lua` and the next `EVALSHA` of `claim.lua`, both as the Redis server
//! stamped them in its `MONITOR` feed: one clock, microseconds, nothing of the bench's own
//! scheduling in the figure. Redis 7 stamps a command when it has run, so the figure runs from
//! the end of the dispatch to the end of the claim (the claim of one shard takes a few µs). Each task is waited for until it completed and the executor blocks again, then a
//! pause of 5–20 ms (varied, so that nothing lines up with a timer) makes sure the executor is
//! truly idle when the next one is dispatched.
//!
//! Why MONITOR: polling `active` from here would measure our own poll interval and round trips,
//! not the executor. MONITOR costs Redis a few µs per command (it formats every command for the
//! monitoring client), which this scenario's few commands per sample hardly notice.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use redis::Value;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::scripts;
use shardctl_coordinator::dispatch::{create_task, new_task_id};
use tokio::sync::{mpsc, oneshot};

use super::scenario::{Ctx, Figures};
use super::{process, stats};

/// Latencies measured per run.
const SAMPLES: usize = 250;
/// Longest any one step of a sample may take before the run counts as failed.
const STEP: Duration = Duration::from_secs(10);

pub(crate) async fn run(ctx: &mut Ctx) -> anyhow::Result<Figures> {
    let mut child = process::executor(ctx, "bench-pickup", &[])?;
    let measured = async {
        stats::wait_blocked(&mut ctx.con, 1, Duration::from_secs(30)).await?;
        let mut monitor = Monitor::start(&ctx.url).await?;
        let sampled = samples(ctx, &mut monitor).await;
        monitor.stop(ctx).await;
        sampled
    }
    .await;
    if let Ok(Some(status)) = child.try_wait() {
        bail!("the executor process exited during the run ({status})");
    }
    process::terminate(&mut child).await;
    let mut ms = measured?;
    ms.sort_by(f64::total_cmp);
    Ok(Figures::from([
        ("samples", ms.len() as f64),
        ("p50_ms", percentile(&ms, 50.0)),
        ("p99_ms", percentile(&ms, 99.0)),
        ("max_ms", ms.last().copied().unwrap_or(0.0)),
    ]))
}

/// The pickup latencies, in ms.
async fn samples(ctx: &mut Ctx, monitor: &mut Monitor) -> anyhow::Result<Vec<f64>> {
    let mut con = ctx.con.clone();
    let random = RandomState::new();
    let mut out = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let spec = TaskSpec::new(new_task_id(), "noop", 1);
        create_task(&mut con, &ctx.keys, &spec).await?;
        // events of before (the executor's claim that found nothing after the last task) are
        // skipped up to our dispatch; then the first claim is the pickup
        let dispatched = monitor.next(Script::Dispatch).await?;
        let claimed = monitor.next(Script::Claim).await?;
        out.push(claimed.saturating_sub(dispatched) as f64 / 1e3);
        // done, and the executor waits on the marker again
        let start = Instant::now();
        loop {
            let state: Option<String> =
                redis::cmd("HGET").arg(ctx.keys.task(&spec.id)).arg("state").query_async(&mut con).await?;
            match state.as_deref() {
                Some("completed") => break,
                Some("failed") | None => bail!("task {} of sample {i} ended {state:?}", spec.id),
                _ => {}
            }
            ensure!(start.elapsed() < STEP, "task {} of sample {i} not completed after {STEP:?}", spec.id);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while stats::blocked_clients(&mut con).await? < 1 {
            ensure!(start.elapsed() < STEP, "the executor did not wait on its marker again after {STEP:?}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let pause = 5 + random.hash_one(i) % 16;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(out)
}

/// The `p`-th percentile of sorted values, by nearest rank (the smallest value with at least
/// p% of the values at or below it); 0 for none.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The scripts whose calls the monitor reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Dispatch,
    Claim,
}

/// A `MONITOR` connection read by a thread of its own (redis-rs's async monitor hands out a
/// `futures` stream, which this crate does not depend on): its blocking client connects like
/// every other (password, ACL user, TLS), and the thread forwards the dispatch and claim calls
/// with their server timestamps.
struct Monitor {
    events: mpsc::UnboundedReceiver<anyhow::Result<(Script, u64)>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    /// Connects and sends MONITOR; returns once the server has accepted it.
    async fn start(url: &str) -> anyhow::Result<Monitor> {
        let client = redis::Client::open(url).context("opening the MONITOR connection")?;
        let shas = [
            (Script::Dispatch, scripts().dispatch.get_hash().to_owned()),
            (Script::Claim, scripts().claim.get_hash().to_owned()),
        ];
        let (tx, events) = mpsc::unbounded_channel();
        let (ready_tx, ready) = oneshot::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("bench-monitor".into()).spawn(move || {
            let mut con = match monitoring(&client) {
                Ok(con) => {
                    let _ = ready_tx.send(Ok(()));
                    con
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            while !stopped.load(Ordering::Relaxed) {
                let line = match con.recv_response() {
                    Ok(Value::SimpleString(line)) => line,
                    Ok(_) => continue,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::Error::new(e).context("reading the MONITOR feed")));
                        return;
                    }
                };
                if let Some(event) = parse_line(&line, &shas) {
                    if tx.send(Ok(event)).is_err() {
                        return;
                    }
                }
            }
        })?;
        let monitor = Monitor { events, stop, thread: Some(thread) };
        match tokio::time::timeout(STEP, ready).await {
            Ok(Ok(Ok(()))) => Ok(monitor),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => bail!("the MONITOR thread ended before it started"),
            Err(_) => bail!("MONITOR not accepted after {STEP:?}"),
        }
    }

    /// The server time (µs since the epoch) of the next call of `script`, skipping others.
    async fn next(&mut self, script: Script) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(Ok((s, at)))) if s == script => return Ok(at),
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => return Err(e),
                Ok(None) => bail!("the MONITOR feed ended"),
                Err(_) => bail!("no {script:?} call seen in the MONITOR feed within {STEP:?}"),
            }
        }
    }

    /// Ends the thread: it checks its flag after each line, and our PING is one.
    async fn stop(mut self, ctx: &mut Ctx) {
        self.stop.store(true, Ordering::Relaxed);
        let _: Result<String, _> = redis::cmd("PING").query_async(&mut ctx.con).await;
        if let Some(thread) = self.thread.take() {
            let joined = tokio::task::spawn_blocking(move || thread.join());
            if tokio::time::timeout(Duration::from_secs(5), joined).await.is_err() {
                eprintln!("pickup: the MONITOR thread did not end; its connection stays open");
            }
        }
    }
}

/// A blocking connection in MONITOR mode.
fn monitoring(client: &redis::Client) -> anyhow::Result<redis::Connection> {
    let mut con = client.get_connection_with_timeout(shardctl_common::conn::CONNECT_TIMEOUT)?;
    con.send_packed_command(&redis::cmd("MONITOR").get_packed_command())?;
    match con.recv_response()? {
        Value::Okay => {}
        other => bail!("MONITOR answered {other:?}"),
    }
    // a guard only: executors send BZPOPMIN every block timeout, and stop() sends a PING
    con.set_read_timeout(Some(Duration::from_secs(60)))?;
    Ok(con)
}

/// One MONITOR line, `1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "<sha>" ...`: the server
/// time in µs when it is a call of one of `shas`' scripts.
fn parse_line(line: &str, shas: &[(Script, String)]) -> Option<(Script, u64)> {
    let (ts, rest) = line.split_once(' ')?;
    let (_, args) = rest.split_once("] ")?;
    // `"EVALSHA" "<sha>" ...`: the command and the sha are the 2nd and 4th pieces between quotes
    let mut quoted = args.split('"');
    let command = quoted.nth(1)?;
    if !command.eq_ignore_ascii_case("evalsha") {
        return None;
    }
    let sha = quoted.nth(1)?;
    let script = shas.iter().find(|(_, s)| s.eq_ignore_ascii_case(sha))?.0;
    let (secs, micros) = ts.split_once('.')?;
    let micros: u64 = format!("{micros:0<6}").get(..6)?.parse().ok()?;
    Some((script, secs.parse::<u64>().ok()? * 1_000_000 + micros))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 100.0);
        assert_eq!(percentile(&v, 99.0), 198.0);
        assert_eq!(percentile(&v, 100.0), 200.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn reads_monitor_lines() {
        let shas = [(Script::Dispatch, "aa11".to_owned()), (Script::Claim, "bb22".to_owned())];
        let line = r#"1700000000.000123 [0 127.0.0.1:5000] "EVALSHA" "bb22" "15" "{q}:wait""#;
        assert_eq!(parse_line(line, &shas), Some((Script::Claim, 1_700_000_000_000_123)));
        let line = r#"1700000001.5 [0 unix:/tmp/r.sock] "evalsha" "AA11" "1""#;
        assert_eq!(parse_line(line, &shas), Some((Script::Dispatch, 1_700_000_001_500_000)));
        assert_eq!(parse_line(r#"1700000000.000123 [0 lua] "ZADD" "k" "0" "0""#, &shas), None);
        assert_eq!(parse_line(r#"1700000000.000123 [0 127.0.0.1:5000] "EVALSHA" "cc33""#, &shas), None);
        assert_eq!(parse_line("garbage", &shas), None);
    }
}
