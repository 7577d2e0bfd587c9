//! A failure reason as people read it: its message and the frame it was raised at, when it
//! carries a traceback (Python) or a stack (Node); and its shape, numbers and ids folded, so that
//! sixty failures of one cause, a row number each, are one group.

/// How the reason of an attempt whose `--worker` could not be started begins (the stuck
/// detection tells such a failure from the handler's own).
pub const START_FAILED: &str = "the worker failed to start: ";

/// Where a traceback's line is a frame: `(file, line, function)`.
fn frame(line: &str) -> Option<(String, String, String)> {
    let l = line.trim();
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    // Python: `File "/app/w.py", line 12, in handle`
    if let Some(rest) = l.strip_prefix("File \"") {
        let (path, rest) = rest.split_once("\", line ")?;
        let (num, func) = rest.split_once(", in ").unwrap_or((rest, "?"));
        return Some((base(path), num.trim().to_owned(), func.trim().to_owned()));
    }
    // Node: `at handle (/app/w.js:3:9)`, `at /app/w.js:3:9`, `at async handle (file:///app/w.js:3:9)`
    let rest = l.strip_prefix("at ")?;
    let (func, place) = match rest.strip_suffix(')').and_then(|r| r.rsplit_once(" (")) {
        Some((f, p)) => (f.trim_start_matches("async ").to_owned(), p),
        None => ("?".to_owned(), rest),
    };
    let mut parts = place.rsplitn(3, ':');
    let (_col, num, path) = (parts.next()?, parts.next()?, parts.next()?);
    num.parse::<u64>().ok()?;
    Some((base(path), num.to_owned(), func))
}

/// One line for `reason`: a traceback's or stack's message (its last line that is not a frame)
/// with its innermost frame, `ValueError: bad row 17 (at w.py:12 in handle)`; any other reason's
/// first line that is not blank.
pub fn summary(reason: &str) -> String {
    let lines: Vec<&str> = reason.lines().filter(|l| !l.trim().is_empty()).collect();
    let frames: Vec<(usize, (String, String, String))> =
        lines.iter().enumerate().filter_map(|(i, l)| frame(l).map(|f| (i, f))).collect();
    let Some(&(first_at, _)) = frames.first() else {
        return lines.first().map_or_else(String::new, |l| l.trim().to_owned());
    };
    let python = lines[first_at].trim_start().starts_with("File \"");
    // Python lists the innermost frame last; Node first
    let inner = if python { frames.last() } else { frames.first() }.map(|(_, f)| f.clone());
    let message =
        lines.iter().rev().find(|l| frame(l).is_none() && !l.trim_start().starts_with("Traceback (")).copied();
    let message = message.map_or("", |m| m.trim());
    match inner {
        Some((file, line, func)) => format!("{message} (at {file}:{line} in {func})"),
        None => message.to_owned(),
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
