//! The one guard around a process a test starts, and the helpers that go with it: [`Process`]
//! (stderr in a log file, SIGKILLed on drop unless it ended), [`signal`] and [`eventually`]
//! (with [`eventually_async`] for async checks).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running child process; SIGKILLed (and reaped) on drop unless it already ended.
pub struct Process {
    child: Child,
    log: PathBuf,
    /// Whether drop removes the log (a temporary one).
    temporary: bool,
    exit: Option<ExitStatus>,
}

impl Process {
    /// Starts `cmd` (stdin and stdout null unless set, stderr appended to `log`).
    pub fn spawn_logging_to(mut cmd: Command, log: &Path) -> Process {
        let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("log file {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Process { child, log: log.to_owned(), temporary: false, exit: None }
    }

    /// Starts `cmd` with its stderr in a temporary log named after `name`, removed on drop.
    pub fn spawn(cmd: Command, name: &str) -> Process {
        let log = std::env::temp_dir().join(format!(
            "shardctl-test-{}-{}-{name}.log",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut p = Process::spawn_logging_to(cmd, &log);
        p.temporary = true;
        p
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where its stderr goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, if it has ended.
    pub fn ended(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait");
        }
        self.exit
    }

    /// Waits for it to end, at most `bound`.
    pub fn wait_exit(&mut self, bound: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(s) = self.ended() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends signal `sig` (`TERM`, `STOP`, `CONT`, ...).
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// SIGKILL, and waits for it to end: a crash, nothing released.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.wait_exit(Duration::from_secs(10));
    }

    /// SIGTERM, then its exit status; panics (with its log) if it has not ended within 30 s.
    pub fn terminate(&mut self) -> ExitStatus {
        self.terminate_within(Duration::from_secs(30))
    }

    /// SIGTERM, then its exit status; panics (with its log) if it has not ended within `bound`.
    pub fn terminate_within(&mut self, bound: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(bound).unwrap_or_else(|| {
            panic!("process {} did not stop within {bound:?} of SIGTERM; log:\n{}", self.pid(), self.log())
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.ended().is_none() {
            // a stopped process must run again to die of anything but SIGKILL; SIGKILL it anyway
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if self.temporary {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Sends signal `sig` (`TERM`, `KILL`, `STOP`, `CONT`, `INT`, `HUP`) to `pid` through kill(1)
/// (no libc). A failure is fine: the process may have ended an instant ago.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).stderr(Stdio::null()).status();
}

/// Polls `f` every 20 ms until it gives a value; panics with `what` and the last state `f`
/// described (its `Err`) after `patience`. A guard against a hang, not a time assertion.
pub fn eventually<T, E: std::fmt::Display>(what: &str, patience: Duration, mut f: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + patience;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("waited for {what}: not so after {patience:?}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// [`eventually`] for async checks: awaits `check` every 20 ms until it holds; panics with
/// `what` after `patience`.
pub async fn eventually_async<F, Fut>(what: &str, patience: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < patience, "gave up waiting for {what} after {patience:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
