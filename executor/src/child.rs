//! The any-language handler protocol: `--exec CMD` runs CMD per shard (no shell) with the shard's
//! facts in `SHARDCTL_*` variables and the task payload on stdin; its stdout is the result (JSON
//! when it parses, else a string); a non-zero exit fails the attempt with the stderr tail as the
//! reason (its exit code may classify the failure: [`crate::exit_codes`]). `--aggregate-exec CMD` reads `{"shard":i,"result":...}` / `{"shard":i,"error":"..."}`
//! lines on stdin in shard order and prints the task result.

use std::process::Stdio;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::exit_codes::ExitCodes;
use crate::handler::{AggregateContext, Aggregator, BoxFuture, Failure, Handler, ShardContext, ShardError};

/// Largest result a child may print, in bytes, unless configured otherwise.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;
/// How much of a failing child's stderr becomes the failure reason.
pub(crate) const STDERR_TAIL: usize = 2048;
/// How long a handler's output is read after it exited: what it started in the background may
/// hold its stdout and stderr open, and the shard ends with the handler, not with those.
const OUTPUT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Splits a command line into program and arguments, honouring single quotes, double quotes
/// and backslash escapes. No shell is involved: no globbing, no variables, no pipes.
pub fn split_command(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(format!("unclosed single quote in '{line}'")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err(format!("trailing backslash in '{line}'")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(format!("unclosed double quote in '{line}'")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.push(chars.next().ok_or_else(|| format!("trailing backslash in '{line}'"))?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    if words.is_empty() {
        return Err("empty command".into());
    }
    Ok(words)
}

/// A child-process command with its output limit.
#[derive(Debug, Clone)]
pub struct ExecCommand {
    program: String,
    args: Vec<String>,
    max_output: usize,
    exit_codes: ExitCodes,
}

impl ExecCommand {
    /// Parses `line` (see [`split_command`]).
    pub fn parse(line: &str, max_output: usize) -> Result<Self, String> {
        let mut words = split_command(line)?;
        let program = words.remove(0);
        Ok(ExecCommand { program, args: words, max_output, exit_codes: ExitCodes::default() })
    }

    /// The same command, its exit codes meaning what `codes` says.
    pub fn with_exit_codes(mut self, codes: ExitCodes) -> Self {
        self.exit_codes = codes;
        self
    }

    /// Whether the program can be started at all: a path names an executable file, a bare name
    /// is found as one in `PATH`. Checked when an executor starts, so that a typo is an error
    /// then and not a failure of every shard.
    pub fn check_runnable(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let runnable =
            |p: &std::path::Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if self.program.contains('/') {
            if runnable(std::path::Path::new(&self.program)) {
                return Ok(());
            }
            return Err(format!("'{}' is not an executable file", self.program));
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        if std::env::split_paths(&path).any(|d| runnable(&d.join(&self.program))) {
            return Ok(());
        }
        Err(format!("'{}' is not found in PATH", self.program))
    }

    /// The program to run.
    pub(crate) fn program(&self) -> &str {
        &self.program
    }

    /// Its arguments.
    pub(crate) fn args(&self) -> &[String] {
        &self.args
    }

    /// The largest output (result) it may print, in bytes.
    pub(crate) fn max_output(&self) -> usize {
        self.max_output
    }

    async fn run(
        &self,
        env: Vec<(&'static str, String)>,
        stdin: Vec<u8>,
        cancel: CancellationToken,
    ) -> Result<Value, ShardError> {
        let (mut child, mut group) = spawn_in_group(Command::new(&self.program).args(&self.args).envs(env))
            .map_err(|e| ShardError::new(format!("cannot start handler command '{}': {e}", self.program)))?;
        let mut input = child.stdin.take().expect("piped stdin");
        let writer = tokio::spawn(async move {
            // a child that does not read its stdin closes the pipe: not an error
            let _ = input.write_all(&stdin).await;
        });
        // the pipes are read to their end, or for OUTPUT_GRACE after the handler exited
        let (stop, read_all) = (CancellationToken::new(), CancellationToken::new());
        let out = read_limited(child.stdout.take().expect("piped stdout"), self.max_output, &stop);
        let err = read_tail(child.stderr.take().expect("piped stderr"), &stop);
        let reads = async {
            let r = tokio::join!(out, err);
            read_all.cancel();
            r
        };
        let program = &self.program;
        let exit = async {
            let st = child.wait().await;
            tokio::select! {
                () = read_all.cancelled() => {}
                () = tokio::time::sleep(OUTPUT_GRACE) => {
                    tracing::debug!(%program, "the handler exited, something it started holds its output open: \
                        its output is what it wrote until then");
                    stop.cancel();
                }
            }
            st
        };
        let status = async {
            let ((out, err), st) = tokio::join!(reads, exit);
            (st, out, err)
        };
        let (status, out, err) = tokio::select! {
            r = status => r,
            // dropping the child kills it (kill_on_drop)
            _ = cancel.cancelled() => return Err(ShardError::new("cancelled: handler process killed")),
        };
        writer.abort();
        // it ended by itself: what it left running in its group is its own business
        group.disarm();
        let status = status.map_err(|e| ShardError::new(format!("handler command '{}' failed: {e}", self.program)))?;
        let out = out.map_err(|e| ShardError::new(format!("reading handler output: {e}")))?;
        if !status.success() {
            let tail = String::from_utf8_lossy(&err).trim().to_owned();
            let how = match status.code() {
                Some(c) => format!("exited with status {c}"),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    format!("was killed by signal {}", status.signal().unwrap_or(0))
                }
            };
            let failure = self.exit_codes.failure(status.code(), out.as_deref().unwrap_or_default());
            let how = if failure == Failure::Retry { how } else { format!("{how} ({})", failure.name()) };
            let reason = if tail.is_empty() { format!("handler {how}") } else { format!("handler {how}: {tail}") };
            return Err(ShardError { reason, failure });
        }
        // a handler that succeeded may still have said something: kept in the debug log
        if !err.is_empty() && tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug!(program = %self.program, "handler stderr: {}", String::from_utf8_lossy(&err).trim());
        }
        let Some(out) = out else {
            return Err(ShardError::new(format!("handler output exceeds the limit of {} bytes", self.max_output)));
        };
        let text = String::from_utf8(out).map_err(|_| ShardError::new("handler output is not valid UTF-8"))?;
        let text = text.trim();
        if text.is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())))
    }
}

/// Reads all of `r` (or what came until `stop`), or `None` once it passes `limit` bytes (the
/// rest is drained).
async fn read_limited(
    mut r: impl AsyncRead + Unpin,
    limit: usize,
    stop: &CancellationToken,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut over = false;
    loop {
        // read first while data comes, but not past `stop` (a background writer never ends)
        let n = if stop.is_cancelled() {
            0
        } else {
            tokio::select! {
                biased;
                n = r.read(&mut chunk) => n?,
                () = stop.cancelled() => 0,
            }
        };
        if n == 0 {
            return Ok((!over).then_some(buf));
        }
        if !over && buf.len() + n > limit {
            over = true;
            buf = Vec::new();
        }
        if !over {
            buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Keeps the last [`STDERR_TAIL`] bytes of `r` (read to its end, or until `stop`).
async fn read_tail(mut r: impl AsyncRead + Unpin, stop: &CancellationToken) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8 * 1024];
    while !stop.is_cancelled() {
        let n = tokio::select! {
            biased;
            n = r.read(&mut chunk) => match n {
                Ok(n) => n,
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 2 * STDERR_TAIL {
            buf.drain(..buf.len() - STDERR_TAIL);
        }
    }
    if buf.len() > STDERR_TAIL {
        buf.drain(..buf.len() - STDERR_TAIL);
    }
    buf
}

/// `--exec`: runs a command per shard.
pub struct ExecHandler(pub Arc<ExecCommand>);

impl Handler for ExecHandler {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        let cmd = self.0.clone();
        Box::pin(async move {
            let env = vec![
                ("SHARDCTL_TASK_ID", ctx.task_id.clone()),
                ("SHARDCTL_KIND", ctx.kind.clone()),
                ("SHARDCTL_SHARD_INDEX", ctx.index.to_string()),
                ("SHARDCTL_SHARD_TOTAL", ctx.total.to_string()),
                ("SHARDCTL_RANGE_START", ctx.range.start.to_string()),
                ("SHARDCTL_RANGE_END", ctx.range.end.to_string()),
                ("SHARDCTL_SHARD_KEY", ctx.key.clone()),
                ("SHARDCTL_ATTEMPT", ctx.attempt.to_string()),
                ("SHARDCTL_NODE_ID", ctx.node_id.to_string()),
            ];
            cmd.run(env, ctx.payload.as_bytes().to_vec(), ctx.cancel.clone()).await
        })
    }
}

/// `--aggregate-exec`: runs a command once per task with the shards' outcomes on stdin.
pub struct ExecAggregator(pub Arc<ExecCommand>);

impl Aggregator for ExecAggregator {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        let cmd = self.0.clone();
        Box::pin(async move {
            let mut stdin = Vec::new();
            for o in ctx.results.iter() {
                let line = match &o.result {
                    Ok(v) => json!({ "shard": o.index, "result": v }),
                    Err(e) => json!({ "shard": o.index, "error": e }),
                };
                serde_json::to_writer(&mut stdin, &line).expect("json to memory");
                stdin.push(b'\n');
            }
            let env = vec![
                ("SHARDCTL_TASK_ID", ctx.task_id.clone()),
                ("SHARDCTL_KIND", ctx.kind.clone()),
                ("SHARDCTL_SHARD_TOTAL", ctx.total.to_string()),
                ("SHARDCTL_DONE", ctx.done.to_string()),
                ("SHARDCTL_FAILED", ctx.failed.to_string()),
                ("SHARDCTL_CANCELLED", ctx.cancelled.len().to_string()),
                ("SHARDCTL_ATTEMPT", ctx.attempt.to_string()),
                ("SHARDCTL_NODE_ID", ctx.node_id.to_string()),
                ("SHARDCTL_PHASE", "aggregate".to_owned()),
            ];
            cmd.run(env, stdin, ctx.cancel.clone()).await
        })
    }
}

/// Starts a handler process (`--exec`, `--worker`): its stdio piped, in a process group of its
/// own (cancelling the handler stops what it started too) listed with the guard, killed if the
/// executor dies; the group is killed when the returned [`GroupKill`] drops.
pub(crate) fn spawn_in_group(cmd: &mut Command) -> std::io::Result<(tokio::process::Child, GroupKill)> {
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()?;
    let group = GroupKill::new(child.id());
    Ok((child, group))
}

/// Kills a handler's process group when dropped before the handler ended (cancelled, timed out,
/// lock lost, shutdown past the grace): `kill_on_drop` alone reaches only the direct child, and
/// what it started (a shell's children, a script's subprocesses) would run on as orphans.
pub(crate) struct GroupKill(Option<u32>);

impl GroupKill {
    /// The group of `pid` (a child started with `process_group(0)`), listed with the guard.
    pub(crate) fn new(pid: Option<u32>) -> Self {
        if let Some(p) = pid {
            crate::guard::watch(p);
        }
        GroupKill(pid)
    }

    pub(crate) fn disarm(&mut self) {
        if let Some(p) = self.0.take() {
            crate::guard::unwatch(p);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // through kill(1): the workspace forbids the unsafe a direct killpg would need
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            crate::guard::unwatch(pgid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_a_shell_without_one() {
        assert_eq!(split_command("python3 -c 'print(1 + 1)'").unwrap(), ["python3", "-c", "print(1 + 1)"]);
        assert_eq!(split_command(r#"a "b c" d\ e ''"#).unwrap(), ["a", "b c", "d e", ""]);
        assert!(split_command("  ").is_err());
        assert!(split_command("a 'b").unwrap_err().contains("unclosed"));
    }
}
