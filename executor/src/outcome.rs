//! How an attempt ended ([`Outcome`]) and the [`Report`] of it waiting to be recorded.

use shardctl_common::scripts::Claimed;

use crate::handler::ShardError;

/// How one attempt ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Success; the JSON text of the result (empty for none).
    Completed(String),
    /// Failure with its reason.
    Failed(ShardError),
    /// Shutdown: give the shard back, claimable at once.
    Release,
    /// Claimed ahead, never started (shutdown): give it back to the front, the claim undone.
    Unstarted,
    /// Claimed ahead and not started: give it back behind the aggregation jobs and retries, the
    /// claim undone.
    GiveBack,
    /// The lock was lost: nothing to record.
    Dropped,
}

#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) claim: Claimed,
    pub(crate) outcome: Outcome,
    /// How long its handler ran (ms), if it ran: a counted completion adds it to its task's
    /// histogram.
    pub(crate) ran_ms: Option<u64>,
    /// A call carrying it may have reached Redis, its reply lost (a connection error): a
    /// completion then refused as lock-less may be that call's own (see [`crate::report::lost_replies`]).
    pub(crate) sent: bool,
}
