//! The executors of one crash round: the server they share, the disruption schedule's
//! generator, each process with what happened to it, and the fleet that starts, disrupts and
//! stops them.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardctl_testkit::{TestCluster, TestRedis};

use super::strip_ansi;
use crate::support::{signal, Process, CHAOS_EXECUTOR_ARGS};
use crate::{GRACE, STOP_MS};

/// Where a round's queue lives: one redis-server, or the master of its slot in a cluster.
pub(crate) enum Server {
    Single(TestRedis),
    Cluster(TestCluster),
}

impl Server {
    /// The URL the executors get.
    pub(crate) fn url(&self) -> String {
        match self {
            Server::Single(r) => r.url(),
            Server::Cluster(c) => c.url(),
        }
    }
    /// The port of the node holding `queue`.
    pub(crate) fn port(&self, queue: &str) -> u16 {
        match self {
            Server::Single(r) => r.port(),
            Server::Cluster(c) => c.owner(c.keyslot(&format!("{{shardctl:{queue}}}"))),
        }
    }
    /// A connection to the node holding `queue`.
    pub(crate) fn con(&self, queue: &str) -> redis::Connection {
        match self {
            Server::Single(r) => r.con(),
            Server::Cluster(c) => c.node_con(self.port(queue)),
        }
    }
    pub(crate) fn log(&self) -> String {
        match self {
            Server::Single(r) => r.log(),
            Server::Cluster(c) => c.logs(),
        }
    }
    /// The cluster of a cluster round.
    pub(crate) fn cluster(&mut self) -> &mut TestCluster {
        match self {
            Server::Cluster(c) => c,
            Server::Single(_) => panic!("a master is killed only on a cluster"),
        }
    }
}

pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(crate) fn ms(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

pub(crate) fn seed(round: u32) -> u64 {
    if let Ok(s) = std::env::var("SHARDCTL_CRASH_SEED") {
        return s.trim().parse().expect("SHARDCTL_CRASH_SEED must be an unsigned integer");
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    // splitmix64 step: rounds started in the same instant still get different schedules
    let mut z = nanos ^ (u64::from(round) << 56) ^ u64::from(std::process::id());
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disruption {
    Kill,
    Stop,
    Term,
}

/// One `shardctl executor` process, and what the round did to it.
pub(crate) struct Exec {
    pub(crate) node: String,
    pub(crate) proc: Process,
    pub(crate) started: Instant,
    /// Logged "executor started": its SIGTERM handler is in place (a start that waits for a
    /// master being failed over takes seconds, and a SIGTERM before it ends the process).
    pub(crate) ready: bool,
    /// SIGSTOPped; SIGCONT is due then.
    pub(crate) stopped_until: Option<Instant>,
    pub(crate) was_stopped: bool,
    /// SIGKILL or SIGTERM sent, and when.
    pub(crate) signalled: Option<(Disruption, Instant)>,
    pub(crate) exit: Option<(ExitStatus, Instant)>,
}

/// The executors of one round, killed (SIGCONT, then SIGKILL) on drop even when a check panics;
/// on a panic their log tails and the server's are printed first.
pub(crate) struct Fleet {
    pub(crate) round: u32,
    pub(crate) queue: String,
    pub(crate) dir: PathBuf,
    pub(crate) execs: Vec<Exec>,
    pub(crate) unexpected_exits: Vec<String>,
    pub(crate) extra_executor_args: &'static [&'static str],
    // last: dropped after the children are gone
    pub(crate) redis: Server,
}

impl Fleet {
    /// On a 3-master cluster with `replicas` replicas per master, or on one server.
    pub(crate) fn new(round: u32, on_cluster: bool, replicas: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("shardctl-crash-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("log dir");
        Fleet {
            round,
            queue: format!("crash-{round}"),
            dir,
            execs: Vec::new(),
            unexpected_exits: Vec::new(),
            extra_executor_args: &[],
            redis: if on_cluster {
                Server::Cluster(TestCluster::start_with_replicas(3, replicas))
            } else {
                Server::Single(TestRedis::start())
            },
        }
    }

    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shardctl"));
        c.args(["--redis", &self.redis.url(), "--queue", &self.queue]);
        c.env_remove("SHARDCTL_LOG").env("NO_COLOR", "1");
        c
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        self.command().args(args).stdin(Stdio::null()).output().expect("run shardctl")
    }

    /// Runs the CLI while reaping the executors, so that an exit during a long command (a
    /// `wait`) is timed when it happens, not when the command returns.
    pub(crate) fn cli_ticking(&mut self, args: &[&str]) -> Output {
        let mut cmd = self.command();
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().expect("run shardctl");
        let run = std::thread::spawn(move || child.wait_with_output().expect("wait for shardctl"));
        while !run.is_finished() {
            self.pause(Duration::from_millis(20));
        }
        run.join().expect("the CLI's reader thread")
    }

    pub(crate) fn spawn(&mut self) -> usize {
        let node = format!("crash{}-{}", self.round, self.execs.len());
        let mut cmd = self.command();
        cmd.args(["executor", "--node-id", &node]).args(CHAOS_EXECUTOR_ARGS).args(self.extra_executor_args);
        self.add(node, cmd)
    }

    /// Starts `cmd` as executor `node` (its log in the round's directory); its index.
    pub(crate) fn add(&mut self, node: String, cmd: Command) -> usize {
        let log = self.dir.join(format!("{node}.log"));
        let proc = Process::spawn_logging_to(cmd, &log);
        self.execs.push(Exec {
            node,
            proc,
            started: Instant::now(),
            ready: false,
            stopped_until: None,
            was_stopped: false,
            signalled: None,
            exit: None,
        });
        self.execs.len() - 1
    }

    /// Executors neither signalled to end, nor stopped, nor exited.
    pub(crate) fn running(&self) -> Vec<usize> {
        (0..self.execs.len())
            .filter(|&i| {
                let e = &self.execs[i];
                e.signalled.is_none() && e.stopped_until.is_none() && e.exit.is_none()
            })
            .collect()
    }

    /// Sends due SIGCONTs and reaps what exited; an exit nobody asked for is recorded.
    pub(crate) fn tick(&mut self) {
        let now = Instant::now();
        for e in &mut self.execs {
            if e.stopped_until.is_some_and(|t| t <= now) {
                e.proc.signal("CONT");
                e.stopped_until = None;
            }
            if e.exit.is_none() {
                if let Some(st) = e.proc.ended() {
                    e.exit = Some((st, now));
                    if e.signalled.is_none() {
                        self.unexpected_exits.push(format!("{} exited on its own ({st})", e.node));
                    }
                }
            }
        }
    }

    pub(crate) fn pause(&mut self, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.tick();
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(10)));
        }
    }

    /// Disrupts one executor; returns what was done (the kind may change, see below).
    pub(crate) fn disrupt(&mut self, kind: Disruption, rng: &mut XorShift) -> (Disruption, String) {
        let running = self.running();
        // a process needs a moment to install its SIGTERM handler: SIGTERM only those that said
        // they started, a moment ago
        for &i in &running {
            let e = &mut self.execs[i];
            e.ready = e.ready || strip_ansi(&e.proc.log()).contains("executor started");
        }
        let settled: Vec<usize> = running
            .iter()
            .copied()
            .filter(|&i| self.execs[i].ready && self.execs[i].started.elapsed() > Duration::from_millis(300))
            .collect();
        let (kind, pool) = match kind {
            // keep at least one executor running (invariant 2 assumes one alive)
            Disruption::Stop if running.len() < 2 => (Disruption::Kill, running),
            Disruption::Term if settled.is_empty() => (Disruption::Kill, running),
            Disruption::Term => (Disruption::Term, settled),
            k => (k, running),
        };
        let i = pool[rng.below(pool.len() as u64) as usize];
        let pid = self.execs[i].proc.pid();
        let node = self.execs[i].node.clone();
        match kind {
            Disruption::Kill => {
                signal(pid, "KILL");
                self.execs[i].signalled = Some((Disruption::Kill, Instant::now()));
                let j = self.spawn();
                (kind, format!("SIGKILL {node} (pid {pid}), started {}", self.execs[j].node))
            }
            Disruption::Term => {
                signal(pid, "TERM");
                self.execs[i].signalled = Some((Disruption::Term, Instant::now()));
                let j = self.spawn();
                (kind, format!("SIGTERM {node} (pid {pid}), started {}", self.execs[j].node))
            }
            Disruption::Stop => {
                let d = rng.ms(STOP_MS);
                signal(pid, "STOP");
                self.execs[i].stopped_until = Some(Instant::now() + d);
                self.execs[i].was_stopped = true;
                (kind, format!("SIGSTOP {node} (pid {pid}) for {d:?}"))
            }
        }
    }

    /// SIGTERM to every live executor; waits for them to exit.
    pub(crate) fn stop_all(&mut self) {
        for e in &mut self.execs {
            if e.exit.is_none() && e.signalled.is_none() {
                e.proc.signal("TERM");
                e.signalled = Some((Disruption::Term, Instant::now()));
            }
        }
        let deadline = Instant::now() + GRACE + Duration::from_secs(10);
        while Instant::now() < deadline && self.execs.iter().any(|e| e.exit.is_none()) {
            self.pause(Duration::from_millis(20));
        }
    }

    pub(crate) fn tails(&self) -> String {
        let mut s = String::new();
        for e in &self.execs {
            let text = strip_ansi(&e.proc.log());
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
            s.push_str(&format!("----- {} ({}) stderr tail:\n{tail}\n", e.node, e.proc.log_path().display()));
        }
        let log = self.redis.log();
        let lines: Vec<&str> = log.lines().collect();
        s.push_str(&format!("----- redis-server log tail:\n{}\n", lines[lines.len().saturating_sub(15)..].join("\n")));
        s
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for e in &mut self.execs {
            if e.exit.is_none() {
                // SIGKILL ends a stopped process too; SIGCONT first costs nothing
                e.proc.signal("CONT");
                e.proc.kill();
            }
        }
        if std::thread::panicking() {
            eprintln!("crash round {}: logs kept in {}\n{}", self.round, self.dir.display(), self.tails());
        } else if std::env::var_os("SHARDCTL_CRASH_KEEP_LOGS").is_some() {
            eprintln!("crash round {}: logs kept in {}", self.round, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
