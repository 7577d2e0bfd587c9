//! What a line of a worker's stdout says, read once: a reply to the request that runs, a sign
//! of life, a late answer to a request that was cancelled, or something the protocol does not
//! allow (docs/handlers.md, "What the executor does when a worker misbehaves").
//!
//! A line is parsed as JSON as the worker's language wrote it: a string that ends in half a
//! surrogate pair (`JSON.stringify` writes `"\ud83d"` for a lone surrogate, a JSON text that
//! RFC 8259 allows but strict parsers refuse) has each lone half read as U+FFFD.

use std::time::Duration;

use serde_json::{Map, Value};
use shardctl_common::failure::Failure;

/// What one line said, while request `current` ran.
pub(super) enum Said {
    /// The reply to the running request.
    Reply(Map<String, Value>),
    /// `{"type":"alive","id":current}`: the worker still works on it.
    Alive,
    /// A late answer to a request that was cancelled: passed over.
    Late,
    /// A reply to a request that is neither running nor cancelled (a worker numbering its
    /// replies itself): the request fails, the worker is replaced.
    WrongId(Value),
    /// Not a JSON object: the protocol's channel held something else (a `print`).
    NotProtocol,
}

/// Reads `text`, a line the worker wrote while `current` ran (`None`: while idle); `last` is the
/// highest id sent to it, `cancelled` the ids whose late answers may still come. A sign of life
/// for an earlier request is late, not wrong: a worker's thread that sends them may write one
/// just after the reply it raced.
pub(super) fn said(text: &str, current: Option<u64>, last: u64, cancelled: &[u64]) -> Said {
    let Some(v) = object(text) else { return Said::NotProtocol };
    let id = v.get("id").and_then(Value::as_u64);
    let alive = v.get("type").and_then(Value::as_str) == Some("alive");
    match id {
        Some(i) if Some(i) == current && alive => Said::Alive,
        Some(i) if Some(i) == current => Said::Reply(v),
        Some(i) if alive && i >= 1 && i <= last => Said::Late,
        Some(i) if cancelled.contains(&i) => Said::Late,
        _ => Said::WrongId(v.get("id").cloned().unwrap_or(Value::Null)),
    }
}

/// The reason and class of an error reply (docs/handlers.md): `error`, with `traceback` before it
/// when given (the message last, so the last line names the exception), and `class` with
/// `retry_after_ms` (docs/design/failure-policies.md). A class the executor does not know, or a
/// `retry_after` without a delay, is a plain failure, and its reason says so first (its message
/// stays last).
pub(super) fn error_of(v: &mut Map<String, Value>) -> (String, Failure) {
    let why = match v.remove("error") {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => "the worker reported an error without a reason".to_owned(),
    };
    let mut reason = match v.get("traceback").and_then(Value::as_str).map(str::trim_end) {
        Some(tb) if !tb.trim().is_empty() && tb.ends_with(why.trim()) => tb.to_owned(),
        Some(tb) if !tb.trim().is_empty() => format!("{tb}\n{why}"),
        _ => why,
    };
    let class = match v.get("class") {
        None | Some(Value::Null) => Some(Failure::Retry),
        Some(c) => match c.as_str() {
            Some("retry") => Some(Failure::Retry),
            Some("permanent") => Some(Failure::Permanent),
            Some("fail_task") => Some(Failure::FailTask),
            Some("retry_after") => {
                let ms = v.get("retry_after_ms").and_then(Value::as_f64).filter(|ms| ms.is_finite() && *ms >= 0.0);
                match ms {
                    Some(ms) => Some(Failure::retry_after(Duration::from_millis(ms.min(u64::MAX as f64) as u64))),
                    None => {
                        reason = format!("(class retry_after without a retry_after_ms of 0 or more: retried after the backoff) {reason}");
                        Some(Failure::Retry)
                    }
                }
            }
            _ => None,
        },
    };
    let class = class.unwrap_or_else(|| {
        // a hostile class is cut: the reason's end (its message) must stay within the 2 KiB kept
        let c: String = v.get("class").map(Value::to_string).unwrap_or_default().chars().take(64).collect();
        reason = format!("(unknown failure class {c}: retried after the backoff) {reason}");
        Failure::Retry
    });
    (reason, class)
}

/// `text` as a JSON object, lone surrogates read as U+FFFD; `None` when it is not one.
pub(super) fn object(text: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Some(m),
        Ok(_) => None,
        // the rare line with a lone surrogate escape: repaired, read again
        Err(_) => match serde_json::from_str::<Value>(&lone_surrogates_replaced(text)?) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        },
    }
}

/// `text` with every `\uXXXX` escape of a lone surrogate (inside a string) made `\ufffd`; `None`
/// when there is none to replace.
pub(super) fn lone_surrogates_replaced(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let hex = |at: usize| -> Option<u16> {
        let s = text.get(at..at + 4)?;
        u16::from_str_radix(s, 16).ok().filter(|_| s.bytes().all(|c| c.is_ascii_hexdigit()))
    };
    // `\u` followed by four hex digits at `at`
    let escape = |at: usize| -> Option<u16> {
        (b.get(at) == Some(&b'\\') && b.get(at + 1) == Some(&b'u')).then_some(())?;
        hex(at + 2)
    };
    let (mut out, mut copied, mut i, mut in_string, mut changed) = (String::new(), 0, 0, false, false);
    while i < b.len() {
        match b[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                if let Some(u) = escape(i) {
                    let lone = match u {
                        0xD800..=0xDBFF => !escape(i + 6).is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)),
                        0xDC00..=0xDFFF => true,
                        _ => false,
                    };
                    if lone {
                        out.push_str(&text[copied..i]);
                        out.push_str("\\ufffd");
                        copied = i + 6;
                        changed = true;
                    } else if (0xD800..=0xDBFF).contains(&u) {
                        i += 6; // the pair's low half is taken with it
                    }
                    i += 6;
                    continue;
                }
                i += 1; // the escaped character (a quote or a backslash) is skipped
            }
            _ => {}
        }
        i += 1;
    }
    changed.then(|| {
        out.push_str(&text[copied..]);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_carry_their_class_and_traceback() {
        let of = |t: &str| error_of(&mut object(t).unwrap());
        assert_eq!(of(r#"{"error":"boom"}"#), ("boom".to_owned(), Failure::Retry));
        assert_eq!(of(r#"{"error":"bad row","class":"permanent"}"#).1, Failure::Permanent);
        assert_eq!(of(r#"{"error":"no key","class":"fail_task"}"#).1, Failure::FailTask);
        let ms = |n: u64| Failure::RetryAfter(Duration::from_millis(n));
        assert_eq!(of(r#"{"error":"429","class":"retry_after","retry_after_ms":1500}"#).1, ms(1500));
        let (why, c) = of(r#"{"error":"429","class":"retry_after"}"#);
        assert_eq!(c, Failure::Retry);
        assert!(why.starts_with("(class retry_after without") && why.ends_with(") 429"), "{why}");
        let (why, c) = of(r#"{"error":"x","class":"later"}"#);
        assert_eq!(c, Failure::Retry);
        assert!(why.contains("unknown failure class \"later\""), "{why}");
        let huge = format!(r#"{{"error":"x","class":"{}"}}"#, "c".repeat(10_000));
        assert!(of(&huge).0.len() < 200, "a hostile class is cut");
        // Python's traceback ends with the message; Node's stack starts with it
        let py = r#"{"error":"ValueError: bad","traceback":"Traceback (most recent call last):\n  File \"w.py\", line 3\nValueError: bad\n"}"#;
        assert_eq!(of(py).0, "Traceback (most recent call last):\n  File \"w.py\", line 3\nValueError: bad");
        let js = r#"{"error":"Error: bad","traceback":"Error: bad\n    at h (/w.js:3:9)"}"#;
        assert_eq!(of(js).0, "Error: bad\n    at h (/w.js:3:9)\nError: bad");
    }

    #[test]
    fn lone_halves_become_the_replacement_character_and_pairs_stay() {
        let fixed = |s: &str| lone_surrogates_replaced(s);
        assert_eq!(fixed(r#"{"r":"report \ud83d"}"#).unwrap(), r#"{"r":"report \ufffd"}"#);
        assert_eq!(fixed(r#"{"r":"\ude00x"}"#).unwrap(), r#"{"r":"\ufffdx"}"#);
        assert_eq!(fixed(r#"{"r":"\ud83d\ud83d\ude00"}"#).unwrap(), r#"{"r":"\ufffd\ud83d\ude00"}"#);
        // a pair, an escaped backslash before a `u`, and text outside strings: untouched
        assert_eq!(fixed(r#"{"r":"\ud83d\ude00"}"#), None);
        assert_eq!(fixed(r#"{"r":"\\ud83d"}"#), None);
        assert_eq!(fixed(r#"{"r":"\"\ud83d"}"#).unwrap(), r#"{"r":"\"\ufffd"}"#);
        let v = object(r#"{"type":"result","id":1,"result":"report \ud83d"}"#).unwrap();
        assert_eq!(v["result"], "report \u{fffd}");
        assert_eq!(object(r#"{"r":"📈 \ud83d\ude00"}"#).unwrap()["r"], "📈 😀");
    }

    #[test]
    fn a_line_is_a_reply_a_sign_of_life_a_late_answer_or_wrong() {
        let kind = |s: &str, cur: Option<u64>, cancelled: &[u64]| match said(s, cur, cur.unwrap_or(1), cancelled) {
            Said::Reply(_) => "reply".to_owned(),
            Said::Alive => "alive".to_owned(),
            Said::Late => "late".to_owned(),
            Said::WrongId(v) => format!("wrong {v}"),
            Said::NotProtocol => "not".to_owned(),
        };
        assert_eq!(kind(r#"{"type":"result","id":3,"result":1}"#, Some(3), &[]), "reply");
        assert_eq!(kind(r#"{"type":"alive","id":3}"#, Some(3), &[]), "alive");
        assert_eq!(kind(r#"{"type":"error","id":2,"error":"cancelled"}"#, Some(3), &[2]), "late");
        // a sign of life for the request before, written just after its reply
        assert_eq!(kind(r#"{"type":"alive","id":2}"#, Some(3), &[]), "late");
        assert_eq!(kind(r#"{"type":"alive","id":4}"#, Some(3), &[]), "wrong 4");
        // a worker that numbers its replies itself, from 0 or from anywhere
        assert_eq!(kind(r#"{"type":"result","id":0,"result":1}"#, Some(1), &[]), "wrong 0");
        assert_eq!(kind(r#"{"type":"result","id":2,"result":1}"#, Some(3), &[]), "wrong 2");
        assert_eq!(kind(r#"{"type":"result","result":1}"#, Some(3), &[]), "wrong null");
        assert_eq!(kind("Loading model...", Some(3), &[]), "not");
        assert_eq!(kind("[1,2]", Some(3), &[]), "not");
    }
}
