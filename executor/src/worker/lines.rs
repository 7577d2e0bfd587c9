//! The lines of a worker process: requests as they are written to its stdin, its stdout read
//! into lines of bounded length, its stderr logged line by line with the shard it runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

use crate::child::STDERR_TAIL;

/// A line of the worker's stdout, or why there are no more.
pub(super) enum Line {
    Text(String),
    TooLong,
    NotUtf8,
    Closed,
}

/// A request's JSON object without its closing brace: `Worker::ask` adds its id.
pub struct Request(String);

impl Request {
    /// `m` (not empty) as a request.
    pub fn from_map(m: serde_json::Map<String, Value>) -> Self {
        debug_assert!(!m.is_empty());
        let mut s = Value::Object(m).to_string();
        s.pop();
        Request(s)
    }

    /// From the text of an object without its closing brace, not empty: `{"type":"shard",...`.
    pub fn from_open_object(s: String) -> Self {
        debug_assert!(s.starts_with('{') && s.len() > 1);
        Request(s)
    }

    /// The request's line with its id.
    pub(super) fn with_id(&self, id: u64) -> Vec<u8> {
        let mut line = Vec::with_capacity(self.0.len() + 24);
        line.extend_from_slice(self.0.as_bytes());
        line.extend_from_slice(format!(",\"id\":{id}}}\n").as_bytes());
        line
    }
}

/// `s` kept to at most `max` bytes by its head and its tail (half each, cut on character
/// boundaries, joined by a line `…`): a reason keeps both the message of a stack (first) and of a
/// traceback (last), and the innermost frames of either.
pub(super) fn ends_of(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let half = max.saturating_sub(5) / 2;
    let mut head = half;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut from = s.len() - half;
    while !s.is_char_boundary(from) {
        from += 1;
    }
    format!("{}\n…\n{}", &s[..head], &s[from..])
}

pub(super) fn clip(s: &str) -> String {
    let s = s.trim();
    if s.len() <= 200 {
        return s.to_owned();
    }
    let mut end = 200;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub(super) fn clip_value(v: &Value) -> String {
    clip(&v.to_string())
}

/// Reads `r` into lines of at most `limit` bytes; a longer line, bytes that are not UTF-8 or
/// the end close the stream.
pub(super) async fn read_lines(r: impl AsyncRead + Unpin, limit: usize, tx: mpsc::Sender<Line>) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        // at most limit + 1 bytes of one line
        // (a read error ends the stream like its end)
        let n: usize = (&mut r).take(limit as u64 + 1).read_until(b'\n', &mut buf).await.unwrap_or_default();
        if n == 0 {
            let _ = tx.send(Line::Closed).await;
            return;
        }
        if buf.last() != Some(&b'\n') && buf.len() > limit {
            let _ = tx.send(Line::TooLong).await;
            return;
        }
        let line = match String::from_utf8(std::mem::take(&mut buf)) {
            Ok(s) => s,
            Err(_) => {
                let _ = tx.send(Line::NotUtf8).await;
                return;
            }
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        if tx.send(Line::Text(line.to_owned())).await.is_err() {
            return;
        }
    }
}

/// Longest stderr line logged as one (a longer one is logged in pieces).
const STDERR_LINE: usize = 4096;

/// Logs each stderr line with the worker's pid and what it runs; keeps the last bytes and
/// counts the lines. Memory stays bounded whatever the worker writes (a line without end is
/// cut every 4 KiB).
pub(super) async fn log_stderr(
    r: impl AsyncRead + Unpin,
    pid: u32,
    running: Arc<Mutex<String>>,
    tail: Arc<Mutex<VecDeque<u8>>>,
    count: Arc<AtomicU64>,
) {
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n: usize = (&mut r).take(STDERR_LINE as u64).read_until(b'\n', &mut line).await.unwrap_or_default();
        if n == 0 {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
        {
            let mut t = tail.lock().unwrap();
            t.extend(line.iter().copied());
            while t.len() > STDERR_TAIL {
                t.pop_front();
            }
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if !text.is_empty() {
            let what = running.lock().unwrap().clone();
            tracing::info!(worker = pid, shard = %what, "worker stderr: {text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_keeps_its_head_and_its_tail() {
        let node = format!(
            "Error: boom\n    at handle (/app/w.js:3:9)\n{}Error: boom",
            "    at outer (/lib/x.js:1:1)\n".repeat(200)
        );
        let kept = ends_of(&node, 2048);
        assert!(kept.len() <= 2048, "{}", kept.len());
        assert!(
            kept.starts_with("Error: boom\n    at handle (/app/w.js:3:9)") && kept.ends_with("Error: boom"),
            "{kept}"
        );
        assert_eq!(ends_of("short", 2048), "short");
        let wide = "é".repeat(2000);
        assert!(ends_of(&wide, 2048).len() <= 2048);
    }
}
