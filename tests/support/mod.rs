//! Set-up of the end-to-end CLI tests: the `shardctl` binary run as a child process (with a hang
//! guard, never a time assertion), a private redis-server and queue per test, and a guard around
//! `shardctl executor` processes that kills them on drop.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shardctl_testkit::TestRedis;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shardctl");

/// How long any one command may run before the test calls it hung (a guard, not an assertion
/// about speed: a healthy command finishes far sooner, even on a loaded machine).
const HANG_GUARD: Duration = Duration::from_secs(120);
/// How long an executor may take to stop after SIGTERM: its grace (2 s here) and a margin.
const STOP_GUARD: Duration = Duration::from_secs(15);

static SEQ: AtomicU64 = AtomicU64::new(0);

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

    /// Starts `shardctl executor --node-id <node>` with short timings for tests, plus `extra`.
    pub fn executor(&self, node: &str, extra: &[&str]) -> Executor {
        let mut args = vec![
            "executor",
            "--node-id",
            node,
            "--concurrency",
            "2",
            "--lock-duration",
            "2s",
            "--stalled-interval",
            "500ms",
            "--block-timeout",
            "200ms",
            "--grace",
            "2s",
        ];
        args.extend_from_slice(extra);
        self.background(node, &args)
    }

    /// Starts `shardctl --redis URL --queue Q <args>` and leaves it running, its stderr (the logs)
    /// in a file named after `name`.
    pub fn background(&self, name: &str, args: &[&str]) -> Executor {
        let mut all = self.global();
        all.extend(args.iter().map(|s| s.to_string()));
        Executor::spawn(self.command(&all.iter().map(String::as_str).collect::<Vec<_>>()), name)
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

    /// Runs `args`, expecting a rejection: exit `code`, `needle` in stderr, nothing on stdout and
    /// no key written.
    pub fn rejects(&self, args: &[&str], code: i32, needle: &str) -> Out {
        let before = self.dbsize();
        let out = self.run(args);
        assert_eq!(out.code(), code, "shardctl {args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "shardctl {args:?}: stderr lacks {needle:?}: {out:?}");
        assert!(out.stdout.trim().is_empty(), "shardctl {args:?}: a rejection printed on stdout: {out:?}");
        assert_eq!(self.dbsize(), before, "shardctl {args:?} wrote to redis: {out:?}");
        out
    }
}

/// A running `shardctl executor` (or other long-running command, or a program of the test's
/// own), SIGKILLed on drop unless it already ended.
pub struct Executor {
    child: Child,
    log: PathBuf,
}

impl Executor {
    /// Starts `cmd` and leaves it running, its stderr in a file named after `name`.
    pub fn spawn(mut cmd: Command, name: &str) -> Executor {
        let log = std::env::temp_dir().join(format!(
            "shardctl-cli-test-{}-{}-{name}.log",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::create(&log).expect("log file");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Executor { child, log }
    }

    /// Its stderr so far (the logs), for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGKILL and waits for the process to end: a crash, nothing released.
    #[allow(dead_code)] // used by tests/cluster.rs and tests/embedding.rs
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id.
    #[allow(dead_code)] // used by tests/auth.rs
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the process to end.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id();
        sigterm(pid);
        let deadline = Instant::now() + STOP_GUARD;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            if Instant::now() > deadline {
                panic!("executor {pid} did not stop after SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Sends SIGTERM to `pid` through `kill` (no libc).
pub fn sigterm(pid: u32) {
    let st = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("run kill");
    assert!(st.success(), "kill -TERM {pid} failed");
}

/// The binary started with `args`, stderr piped, stdout discarded; SIGKILLed on drop unless it
/// already ended.
pub struct Spawned(pub Child);

/// Starts the binary with `args` and leaves it running.
pub fn spawn(args: &[&str]) -> Spawned {
    let child = command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
    Spawned(child)
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
