//! A failure reason as people read it: its message and the frame it was raised at, when it
//! carries a traceback (Python) or a stack (Node); and its shape, numbers and ids folded, so that
//! sixty failures of one cause, a row number each, are one group.

/// How the reason of an attempt whose `--worker` could not be started begins (the stuck
/// detection tells such a failure from the handler's own).
pub const START_FAILED: &str = "the worker failed to start: ";

/// The longest summary, in bytes (cut on a character boundary).
const SUMMARY_MAX: usize = 300;

/// Where a traceback's line is a frame: `(file, line, function)`.
fn frame(line: &str) -> Option<(String, String, String)> {
    let l = line.trim();
    let base = |p: &str| p.rsplit(['/', '\\']).next().unwrap_or(p).to_owned();
    // Python: `File "/app/w.py", line 12, in handle`
    if let Some(rest) = l.strip_prefix("File \"") {
        let (path, rest) = rest.split_once("\", line ")?;
        let (num, func) = rest.split_once(", in ").unwrap_or((rest, "?"));
        num.trim().parse::<u64>().ok()?;
        return Some((base(path), num.trim().to_owned(), func.trim().to_owned()));
    }
    // Node: `at handle (/app/w.js:3:9)`, `at /app/w.js:3:9`, `at async handle (file:///app/w.js:3:9)`;
    // the place must look like a path (a log line `at 10:32:01 connecting` is none)
    let rest = l.strip_prefix("at ")?;
    let (func, place) = match rest.strip_suffix(')').and_then(|r| r.rsplit_once(" (")) {
        Some((f, p)) => (f.trim_start_matches("async ").to_owned(), p),
        None => ("?".to_owned(), rest),
    };
    let mut parts = place.rsplitn(3, ':');
    let (col, num, path) = (parts.next()?, parts.next()?, parts.next()?);
    col.parse::<u64>().ok()?;
    num.parse::<u64>().ok()?;
    let pathlike = path.contains('/') || path.contains('\\') || path.starts_with("node:") || path.starts_with("file:");
    pathlike.then(|| (base(path), num.to_owned(), func))
}

/// `s` cut to at most [`SUMMARY_MAX`] bytes on a character boundary.
fn bounded(s: &str) -> String {
    let mut end = s.len().min(SUMMARY_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// One line for `reason` (at most 300 bytes): a traceback's or stack's message with its
/// innermost frame, `ValueError: bad row 17 (at w.py:12 in handle)`; any other reason's first
/// line that is not blank. Python lists its frames outermost first and its message last; a
/// stack (Node) its message first, then its frames innermost first.
pub fn summary(reason: &str) -> String {
    let lines: Vec<&str> = reason.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    let frames: Vec<(usize, (String, String, String))> =
        lines.iter().enumerate().filter_map(|(i, l)| frame(l).map(|f| (i, f))).collect();
    let first_line = || lines.first().map_or_else(String::new, |l| bounded(l.trim()));
    let Some(&(first_at, _)) = frames.first() else { return first_line() };
    let python = lines[first_at].trim_start().starts_with("File \"");
    let (message, inner) = if python {
        // the last line after the last frame that is not source code shown under it
        let last_at = frames.last().map_or(first_at, |f| f.0);
        let m = lines[last_at + 1..].iter().rev().find(|l| !l.starts_with(' ')).or(lines.last());
        (m.copied(), frames.last().map(|f| f.1.clone()))
    } else {
        // the nearest line before the first frame that is not a frame
        (lines[..first_at].last().copied(), frames.first().map(|f| f.1.clone()))
    };
    let Some(message) = message.map(str::trim).filter(|m| !m.is_empty()) else { return first_line() };
    match inner {
        Some((file, line, func)) => bounded(&format!("{message} (at {file}:{line} in {func})")),
        None => bounded(message),
    }
}

/// `text` with each number made `N` and each id (a token of 8 or more hex digits and dashes with
/// a digit among them, a UUID) made `ID`: the shape that groups failures of one cause.
pub fn shape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        if token.is_empty() {
            return;
        }
        let hexish = token.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if token.len() >= 8 && hexish && token.chars().any(|c| c.is_ascii_digit()) {
            out.push_str("ID");
        } else {
            let mut in_number = false;
            for c in token.chars() {
                if c.is_ascii_digit() {
                    if !in_number {
                        out.push('N');
                    }
                    in_number = true;
                } else {
                    in_number = false;
                    out.push(c);
                }
            }
        }
        token.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracebacks_and_stacks_are_summed_up_by_their_message_and_inner_frame() {
        let py = "Traceback (most recent call last):\n  File \"/usr/lib/x/shardctl_worker/__init__.py\", line 300, in serve\n    result = handler(Shard(msg, cancel))\n  File \"/app/report.py\", line 9, in handle\n    raise ValueError(\"malformed date in row %d\" % s.start)\nValueError: malformed date in row 17";
        assert_eq!(summary(py), "ValueError: malformed date in row 17 (at report.py:9 in handle)");
        let js = "TypeError: no good\n    at handle (/app/w.js:3:9)\n    at async serve (/lib/index.js:220:20)\nTypeError: no good";
        assert_eq!(summary(js), "TypeError: no good (at w.js:3 in handle)");
        let anon = "Error: x\n    at /app/w.js:7:1\nError: x";
        assert_eq!(summary(anon), "Error: x (at w.js:7 in ?)");
        // a node --exec crash on stderr: the message before the frames, a version line last
        let crash = "/app/w.js:3\n  throw new Error('boom');\n  ^\n\nError: boom\n    at Object.<anonymous> (/app/w.js:3:9)\n    at Module._compile (node:internal/modules/cjs/loader:1256:14)\n\nNode.js v18.17.0";
        assert_eq!(summary(crash), "Error: boom (at w.js:3 in Object.<anonymous>)");
        // log lines that only look like frames are none
        assert_eq!(summary("at 10:32:01 connecting\nat 10:32:02 refused"), "at 10:32:01 connecting");
        // CRLF, and a summary is bounded
        assert_eq!(
            summary("Traceback (most recent call last):\r\n  File \"w.py\", line 3, in h\r\nValueError: x\r\n"),
            "ValueError: x (at w.py:3 in h)"
        );
        assert_eq!(summary(&"é".repeat(400)).len(), 300);
        assert_eq!(summary("timed out after 5s\nmore"), "timed out after 5s");
        assert_eq!(summary("\n  handler exited with status 3\n"), "handler exited with status 3");
        assert_eq!(summary(""), "");
    }

    #[test]
    fn numbers_and_ids_fold() {
        assert_eq!(
            shape("ValueError: malformed date in row 17 (at report.py:9 in handle)"),
            "ValueError: malformed date in row N (at report.py:N in handle)"
        );
        assert_eq!(shape("order 3fa85f64-5717-4562-b3fc-2c963f66afa6 missing"), "order ID missing");
        assert_eq!(shape("key deadbeef01 gone, retry 2x"), "key ID gone, retry Nx");
        assert_eq!(shape("Permanent: bad"), "Permanent: bad");
        assert_eq!(shape("é 12 ü"), "é N ü");
    }
}
