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

/// `shardctl lock`'s own outcomes: 123 to 127 and 128 + n (also `wait`'s at SIGINT or SIGTERM).
pub use shardctl::locked::exit::{FAILED, SIGNAL_BASE};

/// The message of an error for the terminal: Redis's refusals of authentication and
/// permission (repeated once per pipelined command) become one sentence that says what to do.
pub fn describe(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    shardctl_common::error::explain(&text).unwrap_or(text)
}

/// Bad input exits 2, everything else 1 (`lock` maps its own: see above).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<shardctl_common::Error>() {
        Some(shardctl_common::Error::Invalid(_) | shardctl_common::Error::Refused { .. }) => USAGE,
        _ => ERROR,
    }
}
