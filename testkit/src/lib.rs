//! Test support: [`TestRedis`] starts a private `redis-server` on a free port, waits until it
//! answers, and kills it on drop. Tests never touch a shared Redis on 6379.
//!
//! # Layout
//! - this file: [`TestRedis`], its restart (for outage tests), port and directory picking.
//! - [`cluster`]: [`TestCluster`], a real 3-master Redis Cluster, and slot checks.
//! - [`process`]: [`Process`], the one guard around a process a test starts; [`signal`],
//!   [`eventually`].
//! - [`browser`]: [`Browser`](browser::Browser), headless Chromium driven over WebDriver
//!   (chromedriver), for the dashboard's tests.
//! - [`secure`]: [`SecureRedis`], a server behind a password, ACL users and optionally TLS (with
//!   a throwaway CA made by `openssl`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A private redis-server, killed on drop.
pub struct TestRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    persistent: bool,
}

pub mod browser;
pub mod cluster;
pub mod process;
pub mod secure;

pub use cluster::TestCluster;
pub use process::{eventually, eventually_async, signal, Process};
pub use secure::SecureRedis;

static SEQ: AtomicU64 = AtomicU64::new(0);

static PORT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A TCP port free on loopback now, below the kernel's ephemeral range (32768 and up by
/// default). A port the OS picks for `bind(0)` is an ephemeral one, and between this call and
/// the server's own bind the kernel may hand it to another process's outgoing connection (a
/// test's many Redis clients open them all the time): a server that then cannot listen fails
/// its test for nothing. Ports are drawn from 20000..32000, spread by the process id and a
/// counter so that threads and processes draw different ones, each checked free.
pub fn free_port() -> u16 {
    const FROM: u64 = 20_000;
    const SPAN: u64 = 12_000;
    let salt = u64::from(std::process::id()).wrapping_mul(2_654_435_761);
    for _ in 0..SPAN {
        let n = PORT_SEQ.fetch_add(1, Ordering::Relaxed);
        let port = (FROM + (salt.wrapping_add(n.wrapping_mul(7_919)) % SPAN)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().unwrap().port()
}

/// `127.0.0.1:<port>` of [`free_port`].
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A fresh directory for one server or cluster of this test process.
fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "shardctl-test-{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

impl TestRedis {
    /// Starts a server that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a server with an append-only file, so that [`TestRedis::restart`] keeps its data.
    pub fn start_persistent() -> Self {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Self {
        let dir = temp_dir("redis");
        // a port picked free can be taken before redis binds it: try a few
        for _ in 0..5 {
            let mut r = TestRedis { child: None, port: free_port(), dir: dir.clone(), persistent };
            if r.spawn() {
                return r;
            }
        }
        panic!(
            "redis-server did not start; log:\n{}",
            std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
        );
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--dir", self.dir.to_str().unwrap(), "--logfile", "redis.log"])
            .args(["--protected-mode", "no"]);
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let child =
            cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}); install it: apt-get install -y redis-server")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(c) = redis::Client::open(self.url()) {
                if let Ok(mut con) = c.get_connection_with_timeout(Duration::from_millis(200)) {
                    if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                        return true;
                    }
                }
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A blocking connection, for test set-up and checks.
    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// The server's log, for panic messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Stops the server (SIGKILL): clients see the connection drop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // with appendfsync always the AOF already holds every write
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart; log:\n{}", self.log());
    }
}

/// Prints the last lines of a redis-server's log (when a test panics, before the server goes).
pub(crate) fn print_log_tail(port: u16, log: &str) {
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    eprintln!("--- redis-server log (port {port}), last lines ---\n{}", tail.join("\n"));
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail(self.port, &self.log());
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the optional tool `name` (run with `probe` arguments) is here for a test that needs
/// it: `false` with a note on stderr when it is missing, so that a developer without it still
/// runs the rest; but where `CI` is set (any value but empty, `0` or `false`, as `.ci/run` and
/// CI services set it) a missing tool panics: in CI no check may skip itself.
pub fn tool_available(name: &str, probe: &[&str], why: &str) -> bool {
    let found =
        Command::new(name).args(probe).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    assert!(!ci, "`{name}` is required in CI ({why}) and is not installed");
    eprintln!("note: `{name}` is not installed: {why} is skipped (CI=true makes this a failure)");
    false
}
