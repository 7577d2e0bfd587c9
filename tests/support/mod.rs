//! Set-up of the end-to-end CLI tests: the `shardctl` binary run as a child process (with a hang
//! guard, never a time assertion), a private redis-server and queue per test, and a guard around
//! `shardctl executor` processes that kills them on drop.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use shardctl_testkit::TestRedis;
#[allow(unused_imports)] // each test file uses a part of the harness
pub use shardctl_testkit::{eventually, signal, Process};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shardctl");

/// How long any one command may run before the test calls it hung (a guard, not an assertion
/// about speed: a healthy command finishes far sooner, even on a loaded machine).
const HANG_GUARD: Duration = Duration::from_secs(120);

/// What one run of the binary did.
pub struct Out {
    /// The exit status.
    pub status: ExitStatus,
    /// Everything printed on stdout.
    pub stdout: String,
    /// Everything printed on stderr.
    pub stderr: String,
}

impl Out {
    /// The exit code; -1 when a signal ended the process.
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout\n{}\n--- stderr\n{}", self.status, self.stdout, self.stderr)
    }
}

/// Writes an executable `#!/bin/sh` script named `name` in `dir`; its path.
#[allow(dead_code)] // used by tests/control.rs and tests/durability.rs
pub fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

/// The lines of a record file (empty when it does not exist yet).
#[allow(dead_code)] // used by tests/control.rs and tests/durability.rs
pub fn lines(p: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(p).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// A command for the binary with no settings leaking in from the environment.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("SHARDCTL_REDIS")
        .env_remove("SHARDCTL_QUEUE")
        .env_remove("SHARDCTL_LOG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    c
}

/// Runs the binary with `args` to its end.
pub fn shardctl(args: &[&str]) -> Out {
    run_to_end(command(args), args)
}

/// Runs `cmd` (the binary with `args`) to its end.
fn run_to_end(mut cmd: Command, args: &[&str]) -> Out {
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"));
    let mut so = child.stdout.take().expect("piped stdout");
    let mut se = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = so.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = se.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + HANG_GUARD;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("shardctl {args:?} hung; killed it. stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = String::from_utf8_lossy(&out.join().expect("stdout reader")).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().expect("stderr reader")).into_owned();
    Out { status, stdout, stderr }
}

/// One private Redis (a redis-server by default, or a cluster, or a secured server) and one
/// queue on it.
pub struct Cli<R = TestRedis> {
    /// Killed on drop.
    pub redis: R,
    /// The queue every command of this test uses.
    pub queue: String,
    /// The `--redis` URL every command gets.
    url: String,
    /// Environment variables every command gets.
    env: Vec<(String, String)>,
    /// What replaces `--redis URL`, if anything.
    redis_args: Option<Vec<String>>,
}

impl Cli {
    /// Starts a server for a test; `queue` names the test's queue.
    pub fn start(queue: &str) -> Self {
        let redis = TestRedis::start();
        Cli { url: redis.url(), redis, queue: queue.to_owned(), env: Vec::new(), redis_args: None }
    }
}

impl<R> Cli<R> {
    /// Commands of queue `queue` against `redis` reached at `url`.
    #[allow(dead_code)] // tests/cli.rs runs on its own server; tests/cluster.rs and tests/auth.rs use it
    pub fn on(redis: R, url: &str, queue: &str) -> Self {
        Cli { redis, queue: queue.to_owned(), url: url.to_owned(), env: Vec::new(), redis_args: None }
    }

    /// Every command also gets `key=value` in its environment.
    #[allow(dead_code)] // used by tests/auth.rs
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Replaces the global `--redis URL` by `args` (for example `--redis-url-file F`).
    #[allow(dead_code)] // used by tests/auth.rs
    pub fn with_redis_args(mut self, args: &[&str]) -> Self {
        self.redis_args = Some(args.iter().map(|s| s.to_string()).collect());
        self
    }

    fn global(&self) -> Vec<String> {
        let mut g = self.redis_args.clone().unwrap_or_else(|| vec!["--redis".into(), self.url.clone()]);
        g.extend(["--queue".into(), self.queue.clone()]);
        g
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = command(args);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Runs `shardctl --redis URL --queue Q <args>`.
    pub fn run(&self, args: &[&str]) -> Out {
        let global = self.global();
        let mut all: Vec<&str> = global.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        run_to_end(self.command(&all), &all)
    }

    /// Runs `args`, expecting exit 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(out.code(), 0, "shardctl {args:?}: {out:?}");
        out.stdout
    }

    /// Runs `args`, expecting a JSON document on stdout and exit `code`.
    pub fn json(&self, args: &[&str], code: i32) -> serde_json::Value {
        let out = self.run(args);
        assert_eq!(out.code(), code, "shardctl {args:?}: {out:?}");
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout of {args:?} is not JSON ({e}): {out:?}"))
    }

    /// Starts `shardctl executor --node-id <node>` with short timings for tests (and a
    /// concurrency of 2 unless `extra` names one), plus `extra`.
    pub fn executor(&self, node: &str, extra: &[&str]) -> Process {
        let concurrency: &[&str] = if extra.contains(&"--concurrency") { &[] } else { &["--concurrency", "2"] };
        let mut args = vec!["executor", "--node-id", node];
        args.extend_from_slice(concurrency);
        args.extend_from_slice(&[
            "--lock-duration",
            "2s",
            "--stalled-interval",
            "500ms",
            "--block-timeout",
            "200ms",
            "--grace",
            "2s",
        ]);
        args.extend_from_slice(extra);
        // a test not about kinds lets its --exec or --worker serve every kind
        if (extra.contains(&"--exec") || extra.contains(&"--worker")) && !extra.contains(&"--kinds") {
            args.extend_from_slice(&["--kinds", "*"]);
        }
        self.background(node, &args)
    }

    /// Starts `shardctl --redis URL --queue Q <args>` and leaves it running, its stderr (the logs)
    /// in a file named after `name`.
    pub fn background(&self, name: &str, args: &[&str]) -> Process {
        let mut all = self.global();
        all.extend(args.iter().map(|s| s.to_string()));
        Process::spawn(self.command(&all.iter().map(String::as_str).collect::<Vec<_>>()), name)
    }
}

impl Cli {
    /// A blocking connection to the test's server.
    pub fn con(&self) -> redis::Connection {
        self.redis.con()
    }

    /// The number of keys in the server.
    pub fn dbsize(&self) -> i64 {
        redis::cmd("DBSIZE").query(&mut self.con()).expect("DBSIZE")
    }

    /// The full name of key `suffix` of the test's queue (default prefix).
    pub fn key(&self, suffix: &str) -> String {
        format!("{{shardctl:{}}}:{suffix}", self.queue)
    }

    /// The events of the queue's log of type `kind`, each as its field map.
    #[allow(dead_code)] // used by tests/failure_policies.rs and tests/speculation.rs
    pub fn events(&self, kind: &str) -> Vec<std::collections::HashMap<String, String>> {
        let all: Vec<(String, Vec<String>)> =
            redis::cmd("XRANGE").arg(self.key("events")).arg("-").arg("+").query(&mut self.con()).unwrap();
        all.into_iter()
            .map(|(_, kv)| kv.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect())
            .filter(|e: &std::collections::HashMap<String, String>| e.get("event").map(String::as_str) == Some(kind))
            .collect()
    }

    /// Runs `args`, expecting a rejection: exit `code`, `needle` in stderr, nothing on stdout and
    /// no key created or removed (but what running executors write on their own schedule: the
    /// stalled sweeps' `stalled-check` marks, the `rebalance-lock`, `meta.placed_members`, and the
    /// prefix's list of queues, `{P:queues}`, which an executor adds its queue to when it joins,
    /// and the partition upkeep's `decide-check` throttle).
    pub fn rejects(&self, args: &[&str], code: i32, needle: &str) -> Out {
        let before = self.keys_but_background();
        let out = self.run(args);
        assert_eq!(out.code(), code, "shardctl {args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "shardctl {args:?}: stderr lacks {needle:?}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "shardctl {args:?}: a rejection printed on stdout: {out:?}");
        assert_eq!(self.keys_but_background(), before, "shardctl {args:?} wrote to redis: {out:?}");
        out
    }

    /// Every key of the server but those running executors write on their own schedule; the
    /// queue's `meta` is listed with its fields but `placed_members` (absent when that is all).
    fn keys_but_background(&self) -> std::collections::BTreeSet<String> {
        let all: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut self.con()).expect("KEYS");
        let meta = self.key("meta");
        let mut keys = std::collections::BTreeSet::new();
        for key in all {
            if key.ends_with(":stalled-check")
                || key.ends_with(":rebalance-lock")
                || key.ends_with(":queues}")
                || key.ends_with(":decide-check")
            {
                continue;
            }
            if key != meta {
                keys.insert(key);
                continue;
            }
            let fields: Vec<String> = redis::cmd("HKEYS").arg(&key).query(&mut self.con()).expect("HKEYS");
            let mut fields: Vec<String> = fields.into_iter().filter(|f| f != "placed_members").collect();
            fields.sort();
            if !fields.is_empty() {
                keys.insert(format!("{key} {}", fields.join(",")));
            }
        }
        keys
    }
}

/// Executor flags of the chaos tests (the crash round, the cluster's): quick locks and sweeps,
/// and `--max-stalled-count 1000` so that repeated crashes never fail a shard and the count must
/// be exact.
#[allow(dead_code)] // used by tests/crash.rs and tests/cluster.rs
pub const CHAOS_EXECUTOR_ARGS: &[&str] = &[
    "--concurrency",
    "2",
    "--lock-duration",
    "1s",
    "--lock-renew",
    "300ms",
    "--stalled-interval",
    "300ms",
    "--max-stalled-count",
    "1000",
    "--block-timeout",
    "200ms",
    "--grace",
    "1s",
];

/// A task's terminal bits, stored results and stored errors (`tkey` is its `task:<id>` key).
#[allow(dead_code)] // used by tests/crash.rs and tests/routing.rs
pub fn task_counts(con: &mut redis::Connection, tkey: &str) -> (u64, u64, u64) {
    redis::pipe()
        .cmd("BITCOUNT")
        .arg(format!("{tkey}:terminal"))
        .cmd("HLEN")
        .arg(format!("{tkey}:results"))
        .cmd("HLEN")
        .arg(format!("{tkey}:errors"))
        .query(con)
        .expect("reading a task's counts")
}

/// What a failover of a partition's master can leave after the share of `task` there was
/// counted in the home (replication is asynchronous): the replica lacks the completion of shard
/// `index` (its bit, its result, its count; the share `running` again), whose claim it still
/// holds under a token whose executor has no lease. `prefix` is the partition's key prefix.
#[allow(dead_code)] // used by tests/partitions.rs and tests/json_schemas.rs
pub fn lose_a_counted_completion(con: &mut redis::Connection, prefix: &str, task: &str, index: u64) {
    let share = format!("{prefix}task:{task}");
    let seq: u64 = redis::cmd("HGET").arg(&share).arg("seq").query(con).unwrap();
    let () = redis::pipe()
        .cmd("SETBIT")
        .arg(format!("{share}:terminal"))
        .arg(index)
        .arg(0)
        .cmd("HDEL")
        .arg(format!("{share}:results"))
        .arg(index)
        .cmd("HINCRBY")
        .arg(&share)
        .arg("done")
        .arg(-1)
        .cmd("HSET")
        .arg(&share)
        .arg("state")
        .arg("running")
        .cmd("HSET")
        .arg(format!("{prefix}active"))
        .arg(format!("{task}:{seq}:{index}"))
        .arg("lost-instance:1")
        .query(con)
        .unwrap();
}
