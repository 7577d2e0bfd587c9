//! What the test machine offers: free ports, fresh directories, optional tools, and a server
//! log's tail for a failing test.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

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
pub(crate) fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "shardctl-test-{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Prints the last lines of a redis-server's log (when a test panics, before the server goes).
pub(crate) fn print_log_tail(port: u16, log: &str) {
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    eprintln!("--- redis-server log (port {port}), last lines ---\n{}", tail.join("\n"));
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
