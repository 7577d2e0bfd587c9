//! A worker's start: its process spawned without a shell in a process group of its own (listed
//! with the guard), its stdout and stderr read by tasks of their own, and its hello awaited;
//! what it prints on stdout before the hello is logged and passed over.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::child::{spawn_in_group, ExecCommand};

use super::lines::{clip, clip_value, log_stderr, read_lines, Line};
use super::process::{Worker, PROTOCOL};
use super::reply;

/// How long a worker has to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// What a line may hold beyond the largest result (the reply's envelope, an error's reason).
const LINE_SLACK: usize = 64 * 1024;
/// Lines a worker may write on stdout before its hello (logged, passed over) before it is
/// stopped as one that does not speak the protocol.
const STRAY_BEFORE_HELLO: usize = 100;

impl Worker {
    /// Starts `cmd` and waits for its hello.
    pub async fn start(cmd: &ExecCommand, node_id: &str, silence: Duration) -> Result<Worker, String> {
        let (mut child, group) = spawn_in_group(
            Command::new(cmd.program())
                .args(cmd.args())
                .env("SHARDCTL_WORKER_PROTOCOL", PROTOCOL.to_string())
                .env("SHARDCTL_NODE_ID", node_id)
                .env("SHARDCTL_MAX_RESULT_BYTES", cmd.max_output().to_string())
                .env("SHARDCTL_WORKER_SILENCE_MS", silence.as_millis().to_string()),
        )
        .map_err(|e| format!("cannot start worker command '{}': {e}", cmd.program()))?;
        let pid = child.id().unwrap_or(0);
        let (tx, lines) = mpsc::channel(64);
        tokio::spawn(read_lines(child.stdout.take().expect("piped stdout"), cmd.max_output() + LINE_SLACK, tx));
        let running = Arc::new(Mutex::new(String::from("(starting)")));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_lines = Arc::new(AtomicU64::new(0));
        tokio::spawn(log_stderr(
            child.stderr.take().expect("piped stderr"),
            pid,
            running.clone(),
            tail.clone(),
            stderr_lines.clone(),
        ));
        let mut w = Worker {
            pid,
            stdin: child.stdin.take(),
            _group: group,
            child,
            lines,
            next_id: 0,
            in_flight: None,
            cancelled: VecDeque::new(),
            answered: 0,
            retiring: false,
            silence,
            stderr_lines,

            started: Instant::now(),
            running,
            tail,
        };
        w.hello().await?;
        w.set_running("(idle)");
        Ok(w)
    }

    /// Waits for the hello. What the worker prints on stdout before it (a banner at import, a
    /// `print` before `serve()`) is logged and passed over, up to [`STRAY_BEFORE_HELLO`] lines.
    async fn hello(&mut self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
        let (mut stray, mut first) = (0, None::<String>);
        let before = |first: &Option<String>| {
            first.as_ref().map_or(String::new(), |t| format!("; it wrote on stdout, which carries the protocol: {t}"))
        };
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv()).await;
            let Ok(line) = line else {
                return Err(format!("worker never said hello within {}s{}", HELLO_TIMEOUT.as_secs(), before(&first)));
            };
            let text = match line.unwrap_or(Line::Closed) {
                Line::Text(t) => t,
                other => return Err(format!("{}{}", self.gone(other, "before its hello").await, before(&first))),
            };
            let v = reply::object(&text);
            if let Some(v) = v.filter(|v| v.get("type").and_then(Value::as_str) == Some("hello")) {
                if v.get("protocol").and_then(Value::as_u64) != Some(PROTOCOL) {
                    let said = clip_value(v.get("protocol").unwrap_or(&Value::Null));
                    return Err(format!("worker speaks protocol {said}, this executor {PROTOCOL}"));
                }
                return Ok(());
            }
            tracing::warn!(
                worker = self.pid,
                "worker wrote on stdout before its hello (stdout carries the protocol: print to stderr); \
                 passed over: {}",
                clip(&text)
            );
            first.get_or_insert_with(|| clip(&text));
            stray += 1;
            if stray > STRAY_BEFORE_HELLO {
                return Err(format!("worker wrote {stray} lines and no hello{}", before(&first)));
            }
        }
    }
}
