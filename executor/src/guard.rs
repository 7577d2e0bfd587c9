//! The guard: handlers stop with their executor, even one that is SIGKILLed (the OOM killer, a
//! node drained hard), which runs no code of its own as it dies.
//!
//! Each handler process (`--exec`, `--worker`) runs in a process group of its own, so a kill of
//! the executor alone does not reach it. The guard is a small `sh` process, started with the
//! first handler, in a process group of its own too: the executor writes to its stdin `+ PGID`
//! for each handler group it starts and `- PGID` for each it is done with; when that stdin
//! closes, which the kernel does as the executor's process ends in any way, the guard kills
//! every group still listed, at once, and exits. The pipe is the executor's alone (its end is
//! close-on-exec: no handler inherits it), so nothing but the executor's end closes it.
//!
//! A guard that died is started again with every listed group. Writes never block the
//! executor: a guard that does not read (frozen) loses the lines that do not fit its pipe, and
//! says so in the log.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// The guard's program: the groups listed, killed at the end of its stdin.
const SCRIPT: &str = r#"g=' '
while read -r op p; do
  case $op in
    +) g="$g$p " ;;
    -) case $g in *" $p "*) g="${g%% $p *} ${g#* $p }" ;; esac ;;
  esac
done
for p in $g; do kill -9 -"$p" 2>/dev/null; done
"#;

static GUARD: Mutex<Guard> =
    Mutex::new(Guard { process: None, groups: BTreeSet::new(), warned: false, cannot_start: false });

struct Guard {
    process: Option<(Child, ChildStdin)>,
    /// The groups listed.
    groups: BTreeSet<u32>,
    warned: bool,
    /// `sh` could not be started: not tried again for every handler.
    cannot_start: bool,
}

/// Lists handler process group `pgid` with the guard: killed if the executor dies.
pub(crate) fn watch(pgid: u32) {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    g.groups.insert(pgid);
    g.send('+', pgid);
}

/// Takes `pgid` off the guard's list (its handler ended, or was killed by the executor).
pub(crate) fn unwatch(pgid: u32) {
    let mut g = GUARD.lock().unwrap_or_else(|e| e.into_inner());
    if g.groups.remove(&pgid) {
        g.send('-', pgid);
    }
}

impl Guard {
    fn send(&mut self, op: char, pgid: u32) {
        let line = format!("{op} {pgid}\n");
        if self.write(line.as_bytes()) {
            return;
        }
        // no guard yet, or it died: a new one, told every group listed
        self.start();
        let all: Vec<u32> = self.groups.iter().copied().collect();
        for p in all {
            if !self.write(format!("+ {p}\n").as_bytes()) {
                return;
            }
        }
    }

    /// Writes `line` (a few bytes: one write of the pipe, whole or not at all); false when
    /// there is no guard to write to.
    fn write(&mut self, line: &[u8]) -> bool {
        let Some((_, stdin)) = self.process.as_mut() else { return false };
        match stdin.write(line) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(
                        "the handlers' guard process does not read its pipe: if this executor dies, \
                        handlers it started from now on may outlive it"
                    );
                }
                true
            }
            Err(_) => {
                // it died (or is dying): reaped, not left a zombie
                if let Some((mut child, _)) = self.process.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                false
            }
        }
    }

    fn start(&mut self) {
        use std::os::unix::process::CommandExt;
        if self.cannot_start {
            return;
        }
        let spawned = Command::new("sh")
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match spawned {
            Ok(mut child) => {
                let stdin = child.stdin.take().expect("piped stdin");
                if let Err(e) = rustix::io::ioctl_fionbio(&stdin, true) {
                    tracing::warn!("the handlers' guard pipe stays blocking: {e}");
                }
                self.process = Some((child, stdin));
            }
            Err(e) => {
                self.cannot_start = true;
                {
                    tracing::warn!(
                        "cannot start the handlers' guard process (sh): {e}; if this executor dies, \
                        its handlers may outlive it"
                    );
                }
            }
        }
    }
}
