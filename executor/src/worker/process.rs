//! One worker process of the `--worker` protocol (docs/handlers.md), once started (`start`):
//! asked one request at a time. Its stdout is read
//! by a task of its own into lines of bounded length; its stderr is logged line by line with
//! the shard it runs, and the last 2 KiB are kept for the reason of a death. What each line
//! says is read by `reply`; what the executor does about each misbehaviour is the table of
//! docs/handlers.md.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use shardctl_common::failure::Failure as Class;

use crate::child::{GroupKill, STDERR_TAIL};

use super::lines::{clip, clip_value, ends_of, Line, Request};
use super::reply::{self, Said};

/// The protocol version spoken.
pub const PROTOCOL: u64 = 1;
/// How long a cancelled request has to be answered before the worker is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// Ids of cancelled requests whose late answers are still passed over.
const CANCELLED_KEPT: usize = 8;

/// How a request went wrong.
#[derive(Debug)]
pub struct Failure {
    /// The reason the shard fails with.
    pub reason: String,
    /// Whether the worker stays usable (it answered with an error, in the protocol).
    pub keep: bool,
    /// Whether the worker exited without reading the request: the shard did not start in it,
    /// and goes to another worker without failing an attempt.
    pub unread: bool,
    /// What the worker said the failure means (a plain failure unless it answered with a class).
    pub class: Class,
}

impl Failure {
    fn fatal(reason: impl Into<String>) -> Self {
        Failure { reason: reason.into(), keep: false, unread: false, class: Class::Retry }
    }
}

/// Why waiting for a reply stopped without one.
enum Stop {
    Line(Line),
    Text(String),
    WrongId(Value),
    Silent,
}

/// A running worker.
pub struct Worker {
    pub(super) child: Child,
    pub(super) pid: u32,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) lines: mpsc::Receiver<Line>,
    pub(super) next_id: u64,
    /// The request sent whole and not yet answered.
    pub(super) in_flight: Option<u64>,
    /// The last cancelled requests: a late answer to one of them is passed over.
    pub(super) cancelled: VecDeque<u64>,
    /// Requests it answered.
    pub(super) answered: u64,
    /// Its last reply said `"retire":true`: it exits, it gets no more requests.
    pub(super) retiring: bool,
    /// How long a request may run with no sign of life (zero: for ever).
    pub(super) silence: Duration,
    /// Lines it wrote on stderr so far (a sign of life).
    pub(super) stderr_lines: Arc<AtomicU64>,

    /// When it was started.
    pub started: Instant,
    /// What it runs now, for its stderr lines.
    pub(super) running: Arc<Mutex<String>>,
    pub(super) tail: Arc<Mutex<VecDeque<u8>>>,
    /// Kills the worker's process group when the worker is dropped.
    pub(super) _group: GroupKill,
}

impl Worker {
    /// The worker's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether an idle worker can take a request: it has not exited, and what it wrote since
    /// its last request is at most late answers to cancelled requests (a second answer to a
    /// cancel); anything else (output of something it left running, a line outside the
    /// protocol) is why not.
    pub async fn ready(&mut self) -> Result<(), String> {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return Err("exited while idle".to_owned());
        }
        while let Ok(line) = self.lines.try_recv() {
            let Line::Text(t) = line else { return Err(self.gone(line, "while idle").await) };
            match reply::said(&t, None, self.next_id, self.cancelled.make_contiguous()) {
                Said::Late => continue,
                Said::NotProtocol => return Err(format!("wrote a line outside the protocol while idle: {}", clip(&t))),
                _ => return Err(format!("wrote a reply while no request ran: {}", clip(&t))),
            }
        }
        Ok(())
    }

    /// Requests it answered.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// Whether its last reply said it exits now (`"retire":true`).
    pub fn retiring(&self) -> bool {
        self.retiring
    }

    /// Lets a worker that said it exits do so: its stdin closed, [`CANCEL_GRACE`] to exit, then
    /// its process group killed.
    pub async fn let_go(mut self) {
        self.stdin = None;
        let _ = tokio::time::timeout(CANCEL_GRACE, self.child.wait()).await;
    }

    pub(super) fn set_running(&self, what: &str) {
        *self.running.lock().unwrap() = what.to_owned();
    }

    /// Sends `request` (a JSON object without `id`) and, for an aggregation, its `follow` lines
    /// (each given the same `id`) and an end line; returns the reply's result. `label` names
    /// the work in the worker's stderr lines. A request is stopped by dropping this future (as
    /// the runtime drops a handler on a cancel, a lost lock or a timeout): the caller then
    /// asks the worker to stop ([`Worker::cancel`]) if the request was sent whole.
    pub async fn ask(
        &mut self,
        request: &Request,
        follow: Option<&mut (dyn Iterator<Item = serde_json::Map<String, Value>> + Send)>,
        label: &str,
    ) -> Result<Value, Failure> {
        self.next_id += 1;
        let id = self.next_id;
        self.set_running(label);
        let (mut written, mut whole) = (0, false);
        let sent = async {
            let line = request.with_id(id);
            written += line.len();
            self.write_line(line).await?;
            // an aggregation's worker may start on its request while its outcomes are written
            whole = true;
            if let Some(follow) = follow {
                for mut line in follow {
                    line.insert("id".into(), id.into());
                    written += self.write(&Value::Object(line)).await?;
                }
                written += self.write(&serde_json::json!({ "type": "end", "id": id })).await?;
            }
            Ok::<(), Failure>(())
        };
        if let Err(f) = sent.await {
            // the pipe was closed before the request's line was whole: it never read it
            let mut f = self.with_death(f).await;
            f.unread = !whole;
            return Err(f);
        }
        self.in_flight = Some(id);
        let reply = self.reply_to(id).await;
        self.in_flight = None;
        let out = match reply {
            Ok((v, text)) => self.reply(v, &text, id),
            Err(Stop::Text(text)) => Err(Failure::fatal(format!(
                "worker wrote a line outside the protocol on stdout, which carries only its replies \
                 (print to stderr): {}",
                clip(&text)
            ))),
            Err(Stop::WrongId(other)) => Err(Failure::fatal(format!(
                "worker answered request {} while {id} ran (a reply's id must be its request's)",
                clip_value(&other)
            ))),
            Err(Stop::Silent) => {
                let secs = self.silence.as_secs();
                let bound = if secs >= 60 && secs % 60 == 0 {
                    format!("{}m", secs / 60)
                } else {
                    format!("{:?}", self.silence)
                };
                Err(Failure::fatal(format!(
                    "worker showed no sign of life for {bound} while it ran request {id} (no line on stdout \
                     or stderr, no CPU time; --worker-silence): it is stuck, or its reply sits in a buffer \
                     it did not flush"
                )))
            }
            Err(Stop::Line(Line::Closed)) if self.unread_bytes() >= written as u64 => {
                let mut f = Failure::fatal(self.gone(Line::Closed, "before reading its request").await);
                f.unread = true;
                Err(f)
            }
            Err(Stop::Line(other)) => Err(Failure::fatal(self.gone(other, "while running the shard").await)),
        };
        self.set_running("(idle)");
        out
    }

    /// Reads lines until the reply to request `id`: late answers to cancelled requests are
    /// passed over, a sign of life restarts the count of silence, anything else is why not.
    /// The CPU baseline is taken only once a request has been quiet for a whole bound (a walk
    /// of `/proc` per request would cost every shard), so silence is found out within two.
    async fn reply_to(&mut self, id: u64) -> Result<(serde_json::Map<String, Value>, String), Stop> {
        let mut life = None;
        let mut quiet = tokio::time::Instant::now() + self.silence;
        loop {
            let next = if self.silence.is_zero() {
                Some(self.lines.recv().await)
            } else {
                tokio::time::timeout_at(quiet, self.lines.recv()).await.ok()
            };
            let Some(line) = next else {
                // quiet for a bound: a worker that used CPU or wrote on stderr since the last
                // look lives (the first look only takes the baseline)
                let now = Some(self.life());
                if now == life {
                    return Err(Stop::Silent);
                }
                (life, quiet) = (now, tokio::time::Instant::now() + self.silence);
                continue;
            };
            let text = match line.unwrap_or(Line::Closed) {
                Line::Text(t) => t,
                other => return Err(Stop::Line(other)),
            };
            match reply::said(&text, Some(id), self.next_id, self.cancelled.make_contiguous()) {
                Said::Reply(v) => return Ok((v, text)),
                Said::Alive | Said::Late => quiet = tokio::time::Instant::now() + self.silence,
                Said::WrongId(v) => return Err(Stop::WrongId(v)),
                Said::NotProtocol => return Err(Stop::Text(text)),
            }
        }
    }

    /// What shows that a worker lives without a line on stdout: the CPU time of its process
    /// group (what it started and waits on included) and the lines it wrote on stderr.
    fn life(&self) -> (u64, u64) {
        (super::life::group_cpu_ticks(self.pid), self.stderr_lines.load(Ordering::Relaxed))
    }

    /// Bytes written to its stdin that it has not read (0 when that cannot be told).
    fn unread_bytes(&self) -> u64 {
        self.stdin.as_ref().and_then(|s| rustix::io::ioctl_fionread(s).ok()).unwrap_or(0)
    }

    /// Whether a request was sent whole and is not answered yet (a worker dropped then may be
    /// cancelled gracefully; one dropped while a request was being written is killed: its
    /// stdin may hold half a line).
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Writes `v` as a line; its length.
    async fn write(&mut self, v: &Value) -> Result<usize, Failure> {
        let mut line = serde_json::to_vec(v).expect("JSON to memory");
        line.push(b'\n');
        let n = line.len();
        self.write_line(line).await.map(|()| n)
    }

    async fn write_line(&mut self, line: Vec<u8>) -> Result<(), Failure> {
        let stdin = self.stdin.as_mut().ok_or_else(|| Failure::fatal("worker's stdin is closed"))?;
        stdin.write_all(&line).await.map_err(|e| Failure::fatal(format!("writing to the worker: {e}")))
    }

    /// The answer of reply `v` (the line `text`) to request `id`.
    fn reply(&mut self, mut v: serde_json::Map<String, Value>, text: &str, id: u64) -> Result<Value, Failure> {
        self.answered += 1;
        self.retiring = v.get("retire").and_then(Value::as_bool) == Some(true);
        match v.get("type").and_then(Value::as_str) {
            Some("result") => Ok(v.remove("result").unwrap_or(Value::Null)),
            Some("error") => {
                let (why, class) = super::reply::error_of(&mut v);
                // stored as the shard's reason: 2 KiB of it, its head and its tail (a stack's
                // message and innermost frames come first, a traceback's last)
                Err(Failure { reason: ends_of(&why, STDERR_TAIL), keep: true, unread: false, class })
            }
            _ => Err(Failure::fatal(format!("worker wrote a reply of unknown type to request {id}: {}", clip(text)))),
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
                let Line::Text(t) = self.lines.recv().await? else { break None };
                match reply::said(&t, Some(id), self.next_id, self.cancelled.make_contiguous()) {
                    Said::Reply(v) => {
                        // an answer: it counts, and it may say the worker exits now
                        self.answered += 1;
                        self.retiring = v.get("retire").and_then(Value::as_bool) == Some(true);
                        break Some(true);
                    }
                    Said::Alive | Said::Late => continue,
                    Said::WrongId(_) | Said::NotProtocol => break Some(false),
                }
            }
        };
        let keep = matches!(tokio::time::timeout(CANCEL_GRACE, exchange).await, Ok(Some(true)));
        // it may answer the cancel too, after its reply: that line is passed over
        self.cancelled.push_back(id);
        if self.cancelled.len() > CANCELLED_KEPT {
            self.cancelled.pop_front();
        }
        self.set_running("(idle)");
        Failure { reason: "cancelled".to_owned(), keep, unread: false, class: Class::Retry }
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
    pub(super) async fn gone(&mut self, line: Line, when: &str) -> String {
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
