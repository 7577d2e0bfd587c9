//! What the scripts wrote for one task, seen on a MONITOR connection: the terminal bits set,
//! the aggregation jobs enqueued and completed.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;

/// What MONITOR saw the scripts write for one task.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// `HINCRBY task done n`: shards counted as done (the sum of the n; a share's count
    /// forgotten by `uncount.lua`, n < 0, subtracts).
    pub(crate) done_incr: i64,
    /// `HINCRBY task done n` with n < 0: shares' counts forgotten.
    pub(crate) uncounts: u64,
    /// `HINCRBY task failed 1`: shards counted as failed.
    pub(crate) failed_incr: u64,
    /// `SETBIT terminal` and each `SET u1` of `BITFIELD terminal`: shards marked terminal (once
    /// per counted shard, or a duplicate).
    pub(crate) setbit: u64,
    /// `HSET task state aggregating`: the aggregation trigger.
    pub(crate) trigger: u64,
    /// `HSET task result`: results recorded.
    pub(crate) result_set: u64,
    /// `HSET task state completed` / `failed`.
    pub(crate) completed: u64,
    pub(crate) failed_state: u64,
    /// Claims of the aggregation job, and its pushes onto `wait` (trigger or release / sweep).
    pub(crate) agg_claims: u64,
    pub(crate) agg_lpush: u64,
    pub(crate) agg_rpush: u64,
    /// Shards put back by the stalled sweep.
    pub(crate) stall_recoveries: u64,
    /// Failed attempts recorded (none are expected from `primes`).
    pub(crate) failed_attempts: u64,
    /// Shards given back by a graceful shutdown.
    pub(crate) releases: u64,
}

pub(crate) const MONITOR_END: &str = "crash-monitor-end";

pub(crate) fn monitor(port: u16, prefix: &str, task: &str) -> JoinHandle<Observed> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("monitor connection");
    s.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("MONITOR reply");
    assert!(line.starts_with("+OK"), "MONITOR: {line}");
    let tkey = format!("\"{prefix}task:{task}\"");
    // per-shard state: one hash per task, fields `<index>:attempt|fails|stalled` (`agg:*`)
    let shards = format!("\"{prefix}task:{task}:shards\"");
    // the tasks of a chaos round are of kind `primes`: their lane
    let wait = format!("\"{prefix}kind:primes:wait\"");
    let active = format!("\"{prefix}active\"");
    // refs are `<task>:<incarnation>:<index|agg>`
    let any_ref = format!("\"{task}:");
    let agg_ref = any_ref.clone();
    let is_agg = move |cmd: &str| cmd.contains(&agg_ref) && cmd.contains(":agg\"");
    let terminal = format!("\"{prefix}task:{task}:terminal\"");
    std::thread::spawn(move || {
        let mut o = Observed::default();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return o,
                Ok(_) => {}
            }
            let l = line.as_str();
            if l.contains(MONITOR_END) {
                return o;
            }
            // `"CMD" "key" args...` after the timestamp and client
            let Some(at) = l.find("] \"") else { continue };
            let cmd = &l[at + 2..];
            let has = |p: &str| cmd.contains(p);
            if cmd.starts_with("\"HINCRBY\" ") {
                if let Some(n) = cmd.split_once(&format!("{tkey} \"done\" \"")).map(|(_, n)| n) {
                    // a batch of completions counts its shards at once
                    let n: String = n.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
                    let n = n.parse::<i64>().unwrap_or_else(|_| panic!("HINCRBY done of no count: {cmd}"));
                    o.done_incr += n;
                    o.uncounts += u64::from(n < 0);
                } else if has(&format!("{tkey} \"failed\" \"1\"")) {
                    o.failed_incr += 1;
                } else if has(&shards) && has(":stalled\" \"1\"") {
                    o.stall_recoveries += 1;
                } else if has(&shards) && has(":fails\" \"1\"") {
                    o.failed_attempts += 1;
                }
            } else if cmd.starts_with(&format!("\"HSET\" {active} ")) && is_agg(cmd) {
                // a claim of the aggregation job holds its ref in `active`
                o.agg_claims += 1;
            } else if cmd.starts_with("\"SETBIT\" ") && has(&terminal) {
                o.setbit += 1;
            } else if cmd.starts_with("\"BITFIELD\" ") && has(&terminal) {
                o.setbit += cmd.matches("\"SET\" \"u1\"").count() as u64;
            } else if cmd.starts_with(&format!("\"HSET\" {tkey} ")) {
                if has("\"state\" \"aggregating\"") {
                    o.trigger += 1;
                } else if has("\"state\" \"completed\"") {
                    o.completed += 1;
                } else if has("\"state\" \"failed\"") {
                    o.failed_state += 1;
                } else if has(&format!("{tkey} \"result\"")) {
                    o.result_set += 1;
                }
            } else if cmd.starts_with(&format!("\"LPUSH\" {wait} ")) {
                if is_agg(cmd) {
                    o.agg_lpush += 1;
                } else if has(&any_ref) {
                    o.releases += 1;
                }
            } else if cmd.starts_with(&format!("\"RPUSH\" {wait} ")) && is_agg(cmd) {
                o.agg_rpush += 1;
            }
        }
    })
}

pub(crate) fn scan(con: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query(con).unwrap();
        out.extend(keys);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}
