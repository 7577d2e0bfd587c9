//! Every exit code of `shardctl`, in one place, and the text of an error on the terminal (docs/commands.md lists them; a test checks
//! `shardctl lock --help` against the lock's). 0 is success.
//!
//! `shardctl lock` passes its command's own exit status through, so, like timeout(1) and
//! env(1), its own outcomes take codes a command rarely uses (123 to 127, 128 + n) and none of
//! 1 to 4.

/// An error: Redis unreachable, a timeout, a missing task, anything not below.
pub const ERROR: u8 = 1;
/// Bad usage or bad input (nothing was written).
pub const USAGE: u8 = 2;
/// `wait`: the task ended with failed shards or a failed aggregation.
pub const TASK_FAILED: u8 = 3;
/// `wait`: the task was cancelled.
pub const TASK_CANCELLED: u8 = 4;

/// The lock stayed held by another past `--wait`; the command did not run.
pub const NOT_ACQUIRED: u8 = 123;
/// The lock was lost while the command ran (or while it was being stopped): its process
/// group was killed.
pub const LOCK_LOST: u8 = 124;
/// shardctl itself failed: bad usage or input, Redis unreachable, any other error.
pub const FAILED: u8 = 125;
/// The command was found but could not be started (permission, not executable).
pub const CANNOT_INVOKE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// shardctl was stopped by signal `n` (SIGINT, SIGTERM, SIGHUP), or the command was killed by
/// signal `n` (as a shell reports it): 128 + n. `wait` ends so at SIGINT or SIGTERM too.
pub const SIGNAL_BASE: u8 = 128;

/// The message of an error for the terminal: Redis's refusals of authentication and
/// permission (repeated once per pipelined command) become one sentence that says what to do.
pub fn describe(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    if text.contains("NOAUTH") {
        return "redis requires authentication: put the user and password in the URL \
                (redis://user:password@host:port), best through --redis-url-file F"
            .into();
    }
    if text.contains("NoPerm") || text.contains("NOPERM") {
        // redis's own words name the command or key; once, not once per pipelined command
        let said = text.split("error: ").nth(1).and_then(|s| s.split(')').next()).unwrap_or("");
        return format!(
            "the redis user lacks a permission shardctl needs (a command, or the keys ~{{PREFIX:*): \
             see docs/operations.md, 'Production Redis', for the minimal ACL (redis said: {said})"
        );
    }
    text
}

/// Bad input exits 2, everything else 1 (`lock` maps its own: see above).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<shardctl_common::Error>() {
        Some(shardctl_common::Error::Invalid(_) | shardctl_common::Error::Refused { .. }) => USAGE,
        _ => ERROR,
    }
}
