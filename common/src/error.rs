//! Errors of the library crates, and the codes the Lua scripts return.

use std::fmt;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis could not be reached or answered with an error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis could not be reached at start.
    #[error("{0}")]
    Unreachable(String),
    /// Bad input from a user: the message says what and why.
    #[error("{0}")]
    Invalid(String),
    /// A script refused the operation.
    #[error("{0}")]
    Script(ScriptCode),
    /// An operator's request refused for the state it found (a task already ended, a node id
    /// in use): the code says which, for a program; the message says it for a person.
    #[error("{message}")]
    Refused {
        /// Which refusal.
        code: ScriptCode,
        /// What was refused and why, for a person.
        message: String,
    },
    /// Redis held something this version cannot read.
    #[error("unexpected data in redis: {0}")]
    Protocol(String),
    /// The task does not exist.
    #[error("no task '{0}'")]
    NoTask(String),
    /// Waiting took longer than allowed.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// Waiting took longer than allowed, and this is why nothing moved.
    #[error("timed out after {after:?}: {why}")]
    TimedOut {
        /// How long it waited.
        after: std::time::Duration,
        /// Why the task did not move, as far as Redis tells.
        why: String,
    },
    /// A write was lost before it reached a replica (a failover of its master,
    /// docs/design/durability.md): what was asked did not happen, and the message says so.
    #[error("{0}")]
    Lost(String),
    /// A distributed lock held by this process was lost (it expired, or another holder took
    /// it): whatever it guarded must stop. Not bad input: the key it names is the lock's.
    #[error("lock {0} lost")]
    LockLost(String),
}

impl Error {
    /// A refusal with its code.
    pub fn refused(code: ScriptCode, message: impl Into<String>) -> Self {
        Error::Refused { code, message: message.into() }
    }
    /// The script code of a refusal, bare or with its message.
    pub fn script_code(&self) -> Option<ScriptCode> {
        match self {
            Error::Script(c) | Error::Refused { code: c, .. } => Some(*c),
            _ => None,
        }
    }
    /// A user-input error.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }
    /// True when trying again later may succeed (Redis unreachable, connection dropped).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Redis(e) => {
                use redis::ServerErrorKind as K;
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || e.is_connection_refusal()
                    // a cluster in a failover: no master for the slot yet, or an old master demoted
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(K::ClusterDown | K::TryAgain | K::MasterDown | K::ReadOnly)
                    )
            }
            _ => false,
        }
    }
    /// True for an error raised inside a Lua script: it repeats on every retry (a script and the
    /// data disagree), unlike an outage, a loading Redis or a full one.
    pub fn is_script_error(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                    && e.to_string().contains("script")
            }
            _ => false,
        }
    }
    /// True when the error says the caller no longer holds a shard's lock.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::Script(c) if c.is_lock_lost())
    }
}

/// The small negative integers the Lua scripts return (listed in `lua/include/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScriptCode {
    /// -1: the lock expired or was never taken.
    LockMissing,
    /// -2: another claim holds the lock.
    LockMismatch,
    /// -3: the task was removed.
    TaskMissing,
    /// -4: the task id is already in use.
    TaskExists,
    /// -5: another live executor holds this node id.
    NodeAlive,
    /// -6: the task's placement cursor moved.
    RouteMoved,
    /// -7: a list no longer starts with the refs read.
    HeadChanged,
    /// -8: a dispatch outside the limits.
    InvalidSpec,
    /// -9: the task already ended (cancel), or was cancelled (retry).
    TaskEnded,
    /// -10: the task's per-shard results were not kept (retry after it ended).
    ResultsDiscarded,
    /// -11: a schedule's fire time is later than Redis's clock (not due yet).
    NotDueYet,
    /// -12: the queue's partitions changed since the caller read them.
    LayoutChanged,
    /// -13: the task met its `--success-when` (retry: nothing to run again).
    Settled,
    /// Any other negative code: a script and this binary disagree.
    Unknown(i64),
}

impl ScriptCode {
    /// Maps a negative code; `None` for codes ≥ 0 (success).
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            c if c >= 0 => None,
            -1 => Some(ScriptCode::LockMissing),
            -2 => Some(ScriptCode::LockMismatch),
            -3 => Some(ScriptCode::TaskMissing),
            -4 => Some(ScriptCode::TaskExists),
            -5 => Some(ScriptCode::NodeAlive),
            -6 => Some(ScriptCode::RouteMoved),
            -7 => Some(ScriptCode::HeadChanged),
            -8 => Some(ScriptCode::InvalidSpec),
            -9 => Some(ScriptCode::TaskEnded),
            -10 => Some(ScriptCode::ResultsDiscarded),
            -11 => Some(ScriptCode::NotDueYet),
            -12 => Some(ScriptCode::LayoutChanged),
            -13 => Some(ScriptCode::Settled),
            c => Some(ScriptCode::Unknown(c)),
        }
    }
    /// True for the stale-holder codes.
    pub fn is_lock_lost(self) -> bool {
        matches!(self, ScriptCode::LockMissing | ScriptCode::LockMismatch)
    }
}

impl fmt::Display for ScriptCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScriptCode::LockMissing => f.write_str("lock missing: the shard's lock expired"),
            ScriptCode::LockMismatch => f.write_str("lock mismatch: another executor holds the shard"),
            ScriptCode::TaskMissing => f.write_str("task missing: it was removed"),
            ScriptCode::TaskExists => f.write_str("a task with this id already exists"),
            ScriptCode::NodeAlive => f.write_str("another live executor holds this node id"),
            ScriptCode::RouteMoved => f.write_str("the task's placement moved on"),
            ScriptCode::HeadChanged => f.write_str("the list changed while it was read"),
            ScriptCode::InvalidSpec => {
                f.write_str("task spec outside the limits (over 2^32 shards or |priority| > 10^6)")
            }
            ScriptCode::TaskEnded => f.write_str("the task already ended"),
            ScriptCode::ResultsDiscarded => f.write_str("the task's per-shard results were not kept"),
            ScriptCode::NotDueYet => f.write_str("the fire time is later than the Redis server's clock"),
            ScriptCode::LayoutChanged => f.write_str("the queue's partitions changed since they were read"),
            ScriptCode::Settled => f.write_str("the task met its --success-when"),
            ScriptCode::Unknown(c) => write!(f, "unknown script code {c}"),
        }
    }
}

/// Redis's refusals of authentication and permission (repeated once per pipelined command), as
/// one sentence that says what to do; `None` for any other error's text.
pub fn explain(text: &str) -> Option<String> {
    if text.contains("NOAUTH") {
        return Some(
            "redis requires authentication: put the user and password in the URL \
             (redis://user:password@host:port), best through --redis-url-file F"
                .into(),
        );
    }
    if text.contains("NoPerm") || text.contains("NOPERM") {
        // redis's own words name the command or key; once, not once per pipelined command
        let said = text.split("error: ").nth(1).and_then(|s| s.split(')').next()).unwrap_or("");
        return Some(format!(
            "the redis user lacks a permission shardctl needs (a command, or the keys ~{{PREFIX:*): \
             see docs/operations.md, 'Production Redis', for the minimal ACL (redis said: {said})"
        ));
    }
    None
}

/// The error for script code `code` (< 0) refusing to `what` task `id`.
pub(crate) fn refused(id: &str, code: i64, what: &str) -> Error {
    match ScriptCode::from_code(code) {
        Some(ScriptCode::TaskMissing) => Error::NoTask(id.to_owned()),
        Some(c @ ScriptCode::TaskEnded) if what == "cancel" => {
            Error::refused(c, format!("task '{id}' already ended: nothing to cancel"))
        }
        Some(c @ ScriptCode::TaskEnded) => {
            Error::refused(c, format!("task '{id}' was cancelled: dispatch it again instead"))
        }
        Some(c @ ScriptCode::ResultsDiscarded) => Error::refused(
            c,
            format!(
                "task '{id}' kept no per-shard results (keep_results false) and has ended: the results of its \
                 completed shards are gone, so its aggregation cannot run again; dispatch it again instead"
            ),
        ),
        Some(c @ ScriptCode::LayoutChanged) => Error::refused(
            c,
            format!(
                "task '{id}' ran over partitions the queue no longer has (`config --partitions` changed them, or \
                 they were re-placed over the cluster's masters since): no executor serves them now; dispatch it \
                 again instead"
            ),
        ),
        Some(c @ ScriptCode::Settled) => Error::refused(
            c,
            format!(
                "task '{id}' met its --success-when: its other shards were cancelled on purpose, so there is nothing \
                 to retry; dispatch a new task to run them"
            ),
        ),
        Some(c) => Error::refused(c, format!("cannot {what} task '{id}': {c}")),
        None => Error::Protocol(format!("unexpected reply {code} to {what}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps() {
        assert_eq!(ScriptCode::from_code(1), None);
        assert_eq!(ScriptCode::from_code(0), None);
        assert_eq!(ScriptCode::from_code(-1), Some(ScriptCode::LockMissing));
        assert_eq!(ScriptCode::from_code(-2), Some(ScriptCode::LockMismatch));
        assert_eq!(ScriptCode::from_code(-3), Some(ScriptCode::TaskMissing));
        assert_eq!(ScriptCode::from_code(-4), Some(ScriptCode::TaskExists));
        assert_eq!(ScriptCode::from_code(-5), Some(ScriptCode::NodeAlive));
        assert_eq!(ScriptCode::from_code(-6), Some(ScriptCode::RouteMoved));
        assert_eq!(ScriptCode::from_code(-7), Some(ScriptCode::HeadChanged));
        assert_eq!(ScriptCode::from_code(-8), Some(ScriptCode::InvalidSpec));
        assert_eq!(ScriptCode::from_code(-9), Some(ScriptCode::TaskEnded));
        assert_eq!(ScriptCode::from_code(-10), Some(ScriptCode::ResultsDiscarded));
        assert_eq!(ScriptCode::from_code(-11), Some(ScriptCode::NotDueYet));
        assert_eq!(ScriptCode::from_code(-12), Some(ScriptCode::LayoutChanged));
        assert_eq!(ScriptCode::from_code(-13), Some(ScriptCode::Settled));
        assert_eq!(ScriptCode::from_code(-14), Some(ScriptCode::Unknown(-14)));
        assert!(ScriptCode::LockMissing.is_lock_lost() && ScriptCode::LockMismatch.is_lock_lost());
        assert!(!ScriptCode::TaskMissing.is_lock_lost());
    }
}
