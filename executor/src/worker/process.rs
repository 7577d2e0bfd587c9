//! One worker process of the `--worker` protocol (docs/handlers.md): started without a shell in
//! a process group of its own, greeted, then asked one request at a time. Its stdout is read
//! by a task of its own into lines of bounded length; its stderr is logged line by line with
//! the shard it runs, and the last 2 KiB are kept for the reason of a death.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::child::{ExecCommand, GroupKill, STDERR_TAIL};

use super::lines::{clip, clip_value, is_stale, log_stderr, read_lines, tail_of, Line, Request};

/// The protocol version spoken.
pub const PROTOCOL: u64 = 1;
/// How long a worker has to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cancelled request has to be answered before the worker is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// What a line may hold beyond the largest result (the reply's envelope, an error's reason).
const LINE_SLACK: usize = 64 * 1024;

/// How a request went wrong.
#[derive(Debug)]
pub struct Failure {
    /// The reason the shard fails with.
    pub reason: String,
    /// Whether the worker stays usable (it answered with an error, in the protocol).
    pub keep: bool,
}

impl Failure {
    fn fatal(reason: impl Into<String>) -> Self {
        Failure { reason: reason.into(), keep: false }
    }
}

/// A running worker.
pub struct Worker {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Line>,
    next_id: u64,
    /// The request sent whole and not yet answered.
    in_flight: Option<u64>,

    /// When it was started.
    pub started: Instant,
    /// What it runs now, for its stderr lines.
    running: Arc<Mutex<String>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
    /// Kills the worker's process group when the worker is dropped.
    _group: GroupKill,
}

impl Worker {
    /// Starts `cmd` and waits for its hello.
    pub async fn start(cmd: &ExecCommand, node_id: &str) -> Result<Worker, String> {
        let mut child = Command::new(cmd.program())
            .args(cmd.args())
            .env("SHARDCTL_WORKER_PROTOCOL", PROTOCOL.to_string())
            .env("SHARDCTL_NODE_ID", node_id)
            .env("SHARDCTL_MAX_RESULT_BYTES", cmd.max_output().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start worker command '{}': {e}", cmd.program()))?;
        let pid = child.id().unwrap_or(0);
        let (tx, lines) = mpsc::channel(64);
        tokio::spawn(read_lines(child.stdout.take().expect("piped stdout"), cmd.max_output() + LINE_SLACK, tx));
        let running = Arc::new(Mutex::new(String::from("(starting)")));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        tokio::spawn(log_stderr(child.stderr.take().expect("piped stderr"), pid, running.clone(), tail.clone()));
        let mut w = Worker {
            pid,
            stdin: child.stdin.take(),
            _group: GroupKill(child.id()),
            child,
            lines,
            next_id: 0,
            in_flight: None,

            started: Instant::now(),
            running,
            tail,
        };
        w.hello().await?;
        w.set_running("(idle)");
        Ok(w)
    }

    /// The worker's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether an idle worker can take a request: it has not exited, and what it wrote since
    /// its last request is at most late answers to earlier requests (a reply that came after
    /// its cancel was answered); anything else (output of something it left running, a line
    /// outside the protocol) is why not.
    pub async fn ready(&mut self) -> Result<(), String> {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return Err("exited while idle".to_owned());
        }
        while let Ok(line) = self.lines.try_recv() {
            match line {
                Line::Text(t) if is_stale(&t, self.next_id) => continue,
                Line::Text(t) => return Err(format!("wrote a line outside the protocol while idle: {}", clip(&t))),
                other => return Err(self.gone(other, "while idle").await),
            }
        }
        Ok(())
    }

    fn set_running(&self, what: &str) {
        *self.running.lock().unwrap() = what.to_owned();
    }

    async fn hello(&mut self) -> Result<(), String> {
        let line = tokio::select! {
            l = self.lines.recv() => l.unwrap_or(Line::Closed),
            () = tokio::time::sleep(HELLO_TIMEOUT) => {
                return Err(format!("worker never said hello within {}s", HELLO_TIMEOUT.as_secs()));
            }
        };
        let text = match line {
            Line::Text(t) => t,
            other => return Err(self.gone(other, "before its hello").await),
        };
        let v: Value =
            serde_json::from_str(&text).map_err(|_| format!("worker's first line is not a hello: {}", clip(&text)))?;
        if v["type"] != "hello" {
            return Err(format!("worker's first line is not a hello: {}", clip(&text)));
        }
        if v["protocol"].as_u64() != Some(PROTOCOL) {
            return Err(format!("worker speaks protocol {}, this executor {PROTOCOL}", v["protocol"]));
        }
        Ok(())
    }

    /// Sends `request` (a JSON object without `id`) and, for an aggregation, its `follow` lines
    /// (each given the same `id`) and an end line; returns the reply's result. `label` names
    /// the work in the worker's stderr lines. A request is stopped by dropping this future (as
    /// the runtime drops a handler on a cancel, a lost lock or a timeout): the caller then
    /// asks the worker to stop ([`Worker::cancel`]) if the request was sent whole.
    pub async fn ask(
        &mut self,
        request: Request,
        follow: Option<&mut (dyn Iterator<Item = serde_json::Map<String, Value>> + Send)>,
        label: &str,
    ) -> Result<Value, Failure> {
        self.next_id += 1;
        let id = self.next_id;
        self.set_running(label);
        let sent = async {
            self.write_line(request.with_id(id)).await?;
            if let Some(follow) = follow {
                for mut line in follow {
                    line.insert("id".into(), id.into());
                    self.write(&Value::Object(line)).await?;
                }
                self.write(&serde_json::json!({ "type": "end", "id": id })).await?;
            }
            Ok::<(), Failure>(())
        };
        if let Err(f) = sent.await {
            return Err(self.with_death(f).await);
        }
        self.in_flight = Some(id);
        // each line parsed once: a late answer to an earlier request is passed over
        let reply = loop {
            let line = self.lines.recv().await.unwrap_or(Line::Closed);
            let Line::Text(text) = line else { break Err(line) };
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(v)) if v.get("id").and_then(Value::as_u64).is_some_and(|i| i < id) => continue,
                Ok(Value::Object(v)) => break Ok((v, text)),
                _ => break Err(Line::Text(text)),
            }
        };
        self.in_flight = None;
        let out = match reply {
            Ok((v, text)) => Self::reply(v, &text, id),
            Err(Line::Text(text)) => {
                Err(Failure::fatal(format!("worker wrote a line outside the protocol: {}", clip(&text))))
            }
            Err(other) => Err(Failure::fatal(self.gone(other, "while running the shard").await)),
        };
        self.set_running("(idle)");
        out
    }

    /// Whether a request was sent whole and is not answered yet (a worker dropped then may be
    /// cancelled gracefully; one dropped while a request was being written is killed: its
    /// stdin may hold half a line).
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    async fn write(&mut self, v: &Value) -> Result<(), Failure> {
        let mut line = serde_json::to_vec(v).expect("JSON to memory");
        line.push(b'\n');
        self.write_line(line).await
    }

    async fn write_line(&mut self, line: Vec<u8>) -> Result<(), Failure> {
        let stdin = self.stdin.as_mut().ok_or_else(|| Failure::fatal("worker's stdin is closed"))?;
        stdin.write_all(&line).await.map_err(|e| Failure::fatal(format!("writing to the worker: {e}")))
    }

    /// The answer of reply `v` (the line `text`) to request `id`.
    fn reply(mut v: serde_json::Map<String, Value>, text: &str, id: u64) -> Result<Value, Failure> {
        if v.get("id").and_then(Value::as_u64) != Some(id) {
            return Err(Failure::fatal(format!("worker answered request {} while {id} ran", clip_value(&v["id"]))));
        }
        match v.get("type").and_then(Value::as_str) {
            Some("result") => Ok(v.remove("result").unwrap_or(Value::Null)),
            Some("error") => {
                let why = match v.remove("error") {
                    Some(Value::String(s)) => s,
                    Some(other) => other.to_string(),
                    None => "the worker reported an error without a reason".to_owned(),
                };
                // stored as the shard's reason: its last 2 KiB, as for `--exec`'s stderr
                Err(Failure { reason: tail_of(&why, STDERR_TAIL), keep: true })
            }
            _ => Err(Failure::fatal(format!("worker wrote a reply of unknown type: {}", clip(text)))),
        }
    }

    /// Asks the worker to stop the request in flight; waits [`CANCEL_GRACE`] for its answer. The
    /// request fails either way; the worker stays only if it answered.
    pub async fn cancel(&mut self) -> Failure {
        let Some(id) = self.in_flight.take() else {
            return Failure::fatal("cancelled");
        };
        // the whole exchange within the grace: a worker that stopped reading its stdin cannot
        // hold the write up
        let exchange = async {
            self.write(&serde_json::json!({ "type": "cancel", "id": id })).await.ok()?;
            loop {
                match self.lines.recv().await? {
                    Line::Text(t) if is_stale(&t, id - 1) => continue,
                    Line::Text(t) => {
                        break Some(serde_json::from_str::<Value>(&t).is_ok_and(|v| v["id"].as_u64() == Some(id)))
                    }
                    _ => break None,
                }
            }
        };
        let keep = matches!(tokio::time::timeout(CANCEL_GRACE, exchange).await, Ok(Some(true)));
        self.set_running("(idle)");
        Failure { reason: "cancelled".to_owned(), keep }
    }

    /// `f`, with the worker's exit status and stderr tail if it died.
    async fn with_death(&mut self, f: Failure) -> Failure {
        if let Ok(Ok(st)) = tokio::time::timeout(Duration::from_millis(200), self.child.wait()).await {
            return Failure::fatal(format!("{}: worker {}{}", f.reason, describe(st), self.tail_text()));
        }
        f
    }

    /// Why there is no line: the worker exited (its status and stderr tail), or wrote one too
    /// long or not UTF-8.
    async fn gone(&mut self, line: Line, when: &str) -> String {
        match line {
            Line::TooLong => "worker wrote a line longer than the result limit allows".to_owned(),
            Line::NotUtf8 => "worker wrote a line that is not valid UTF-8".to_owned(),
            Line::Text(t) => format!("unexpected line: {}", clip(&t)),
            Line::Closed => {
                // its stdout closed: it exited, or is about to
                let st = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
                let how = match st {
                    Ok(Ok(st)) => describe(st),
                    _ => "closed its stdout".to_owned(),
                };
                // the stderr reader may still be draining the last lines
                tokio::time::sleep(Duration::from_millis(20)).await;
                format!("worker {how} {when}{}", self.tail_text())
            }
        }
    }

    fn tail_text(&self) -> String {
        let tail = self.tail.lock().unwrap();
        let bytes: Vec<u8> = tail.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes).trim().to_owned();
        if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // its stdin closes (the end, for a worker that reads it), then `_group` (dropped after
        // this) kills its process group: nothing it started outlives it
        self.stdin = None;
    }
}

fn describe(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "exited".to_owned(),
    }
}
