//! The executor's Prometheus metrics, each described once here. The library only calls the
//! `metrics` facade (a no-op until a recorder is installed); the binary installs the exporter and
//! calls [`describe`]. Handles are registered once per executor (at [`crate::Executor::connect`],
//! so the recorder must be installed before it), labelled `queue` and `node`: the hot path is an
//! atomic add, never a registry lookup.
//!
//! Every claimed ref (shard or aggregation job) ends in exactly one of: completed, failed, an
//! aggregation, retried, released, or lost; so once nothing is in flight,
//! `claimed = completed + failed + aggregations + retried + released + locks_lost + cancelled`
//! (apart from
//! the rare report of a shard already terminal, or of a task removed meanwhile).

use shardctl_common::failure::Failure;

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Label, Unit};

/// Counter: refs claimed (shards and aggregation jobs).
pub const SHARDS_CLAIMED: &str = "shardctl_shards_claimed_total";
/// Counter: shards completed and counted by this executor (aggregation jobs not included).
pub const SHARDS_COMPLETED: &str = "shardctl_shards_completed_total";
/// Counter, label `class`: shards failed for good by this executor.
pub const SHARDS_FAILED: &str = "shardctl_shards_failed_total";
/// Counter, label `failure` (`retry`, `permanent`, `retry_after`, `fail_task`): failed attempts
/// (shards and aggregation jobs) by what their handler said the failure means
/// (docs/design/failure-policies.md).
pub const ATTEMPTS_FAILED: &str = "shardctl_attempts_failed_total";
/// Counter: failed attempts scheduled for a retry (shards and aggregation jobs).
pub const SHARDS_RETRIED: &str = "shardctl_shards_retried_total";
/// Counter: refs given back (claimable at once): at shutdown, or claimed ahead and not started.
pub const SHARDS_RELEASED: &str = "shardctl_shards_released_total";
/// Counter, label `outcome` (`completed`, `failed`): aggregation jobs ended by this executor.
pub const AGGREGATIONS: &str = "shardctl_aggregations_total";
/// Counter: heartbeats that extended this executor's lease (one per beat).
pub const LOCK_HEARTBEATS: &str = "shardctl_lock_heartbeats_total";
/// Counter: held refs kept alive by those heartbeats (one per held ref per beat).
pub const LOCKS_EXTENDED: &str = "shardctl_locks_extended_total";
/// Counter: refs found no longer held: by the heartbeat, or refused when reported.
pub const LOCKS_LOST: &str = "shardctl_locks_lost_total";
/// Counter: confirmations of completions and aggregation claims (docs/design/durability.md), made
/// when the queue's durability asks.
pub const DURABILITY_CONFIRMATIONS: &str = "shardctl_durability_confirmations_total";
/// Counter: those confirmations whose wait for a replica timed out (each is repeated).
pub const DURABILITY_TIMEOUTS: &str = "shardctl_durability_timeouts_total";
/// Counter: completions a confirmation found lost (a failover), then recorded again.
pub const DURABILITY_LOST: &str = "shardctl_durability_lost_total";
/// Counter: running shards stopped because their task was cancelled.
pub const SHARDS_CANCELLED: &str = "shardctl_shards_cancelled_total";
/// Counter: backup attempts of straggling shards this executor started
/// (docs/design/speculation.md).
pub const BACKUPS_STARTED: &str = "shardctl_backups_started_total";
/// Counter: backup attempts this executor finished before their shard's first attempt.
pub const BACKUPS_WON: &str = "shardctl_backups_won_total";
/// Histogram: how long each backup attempt that did not finish first ran before it was stopped,
/// seconds (its `_sum` is the time backups wasted).
pub const BACKUP_LOST_SECONDS: &str = "shardctl_backup_lost_seconds";
/// Histogram: handler run time of one shard attempt, seconds.
pub const SHARD_RUN_SECONDS: &str = "shardctl_shard_run_seconds";
/// Histogram: round trip of one claim call, seconds.
pub const CLAIM_SECONDS: &str = "shardctl_claim_seconds";
/// Gauge: refs held now (claimed, outcome not yet recorded).
pub const SHARDS_IN_FLIGHT: &str = "shardctl_shards_in_flight";
/// Counter: Redis calls (claim, wait, report, heartbeat) that failed on the connection.
pub const REDIS_RECONNECTS: &str = "shardctl_redis_reconnects_total";

/// The values of the `class` label of [`SHARDS_FAILED`], as [`reason_class`] returns them.
pub const FAILURE_CLASSES: [&str; 8] =
    ["panic", "exit", "no_handler", "too_large", "payload", "cancelled", "timeout", "error"];

/// The values of the `failure` label of [`ATTEMPTS_FAILED`] (`Failure::name`).
pub const ATTEMPT_FAILURES: [&str; 4] = ["retry", "permanent", "retry_after", "fail_task"];

/// Bucket bounds of [`SHARD_RUN_SECONDS`]: a millisecond to an hour.
pub const RUN_SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
/// Bucket bounds of [`CLAIM_SECONDS`]: a tenth of a millisecond to five seconds.
pub const CLAIM_SECONDS_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Each histogram of this crate with its bucket bounds, for the exporter.
pub fn buckets() -> [(&'static str, &'static [f64]); 3] {
    [
        (SHARD_RUN_SECONDS, RUN_SECONDS_BUCKETS),
        (CLAIM_SECONDS, CLAIM_SECONDS_BUCKETS),
        (BACKUP_LOST_SECONDS, RUN_SECONDS_BUCKETS),
    ]
}

/// Describes every metric of the executor to the installed recorder (call once, after installing).
pub fn describe() {
    describe_counter!(SHARDS_CLAIMED, "Refs claimed by this executor (shards and aggregation jobs).");
    describe_counter!(SHARDS_COMPLETED, "Shards completed and counted by this executor.");
    describe_counter!(SHARDS_FAILED, "Shards failed for good by this executor, by class of reason.");
    describe_counter!(ATTEMPTS_FAILED, "Failed attempts, by what their handler said the failure means.");
    describe_counter!(SHARDS_RETRIED, "Failed attempts scheduled for a retry (shards and aggregation jobs).");
    describe_counter!(
        SHARDS_RELEASED,
        "Refs given back, claimable at once: at shutdown, or claimed ahead and not started soon."
    );
    describe_counter!(AGGREGATIONS, "Aggregation jobs ended by this executor, by outcome.");
    describe_counter!(LOCK_HEARTBEATS, "Heartbeats that extended this executor's lease (one per beat).");
    describe_counter!(LOCKS_EXTENDED, "Held refs kept alive by the heartbeats (one per held ref per beat).");
    describe_counter!(LOCKS_LOST, "Refs no longer held: found by the heartbeat or refused when reported.");
    describe_counter!(SHARDS_CANCELLED, "Running shards stopped because their task was cancelled.");
    describe_counter!(DURABILITY_CONFIRMATIONS, "Confirms of completions and aggregation claims (durability replica).");
    describe_counter!(DURABILITY_TIMEOUTS, "Confirms whose wait for a replica timed out (each is repeated).");
    describe_counter!(DURABILITY_LOST, "Completions a confirmation found lost in a failover, then recorded again.");
    describe_counter!(BACKUPS_STARTED, "Backup attempts of straggling shards started by this executor.");
    describe_counter!(BACKUPS_WON, "Backup attempts this executor finished before their shard's first attempt.");
    describe_histogram!(
        BACKUP_LOST_SECONDS,
        Unit::Seconds,
        "How long each backup attempt that did not finish first ran before it was stopped."
    );
    describe_histogram!(SHARD_RUN_SECONDS, Unit::Seconds, "Run time of one shard attempt.");
    describe_histogram!(CLAIM_SECONDS, Unit::Seconds, "Round trip of one claim call.");
    describe_gauge!(SHARDS_IN_FLIGHT, "Refs held now: claimed, outcome not yet recorded.");
    describe_counter!(REDIS_RECONNECTS, "Redis calls that failed on the connection (claim, wait, report, heartbeat).");
}

/// The class of a failure reason, for the `class` label: the reasons the runtime itself writes
/// (see `run.rs`, `child.rs`, `handler.rs`) are recognised by their start; anything else,
/// including a handler's own reasons, is `error`.
pub fn reason_class(reason: &str) -> &'static str {
    let starts = |p: &str| reason.starts_with(p);
    if starts("handler panicked") {
        "panic"
    } else if starts("handler exited with status") || starts("handler was killed by signal") {
        "exit"
    } else if starts("no handler for kind") {
        "no_handler"
    } else if (starts("result is ") && reason.contains("the limit is")) || starts("handler output exceeds the limit") {
        "too_large"
    } else if starts("malformed payload") {
        "payload"
    } else if starts("cancelled") {
        "cancelled"
    } else if starts("timed out") || starts("timeout") {
        "timeout"
    } else {
        "error"
    }
}

/// One executor's metric handles.
pub(crate) struct Metrics {
    pub(crate) claimed: Counter,
    pub(crate) completed: Counter,
    failed: [Counter; FAILURE_CLASSES.len()],
    /// By [`ATTEMPT_FAILURES`].
    attempts_failed: [Counter; 4],
    pub(crate) retried: Counter,
    pub(crate) released: Counter,
    pub(crate) aggregations_completed: Counter,
    pub(crate) aggregations_failed: Counter,
    pub(crate) heartbeats: Counter,
    pub(crate) locks_extended: Counter,
    pub(crate) locks_lost: Counter,
    pub(crate) cancelled: Counter,
    pub(crate) durability_confirmations: Counter,
    pub(crate) durability_timeouts: Counter,
    pub(crate) durability_lost: Counter,
    pub(crate) backups_started: Counter,
    pub(crate) backups_won: Counter,
    pub(crate) backup_lost_seconds: Histogram,
    pub(crate) run_seconds: Histogram,
    pub(crate) claim_seconds: Histogram,
    pub(crate) in_flight: Gauge,
    pub(crate) reconnects: Counter,
}

impl Metrics {
    /// Registers every handle with labels `queue` and `node` (with no recorder: no-op handles).
    pub(crate) fn new(queue: &str, node: &str) -> Self {
        let base = vec![Label::new("queue", queue.to_owned()), Label::new("node", node.to_owned())];
        let with = |k: &'static str, v: &'static str| {
            let mut l = base.clone();
            l.push(Label::new(k, v));
            l
        };
        Metrics {
            claimed: metrics::counter!(SHARDS_CLAIMED, base.clone()),
            completed: metrics::counter!(SHARDS_COMPLETED, base.clone()),
            failed: FAILURE_CLASSES.map(|c| metrics::counter!(SHARDS_FAILED, with("class", c))),
            attempts_failed: ATTEMPT_FAILURES.map(|c| metrics::counter!(ATTEMPTS_FAILED, with("failure", c))),
            retried: metrics::counter!(SHARDS_RETRIED, base.clone()),
            released: metrics::counter!(SHARDS_RELEASED, base.clone()),
            aggregations_completed: metrics::counter!(AGGREGATIONS, with("outcome", "completed")),
            aggregations_failed: metrics::counter!(AGGREGATIONS, with("outcome", "failed")),
            heartbeats: metrics::counter!(LOCK_HEARTBEATS, base.clone()),
            locks_extended: metrics::counter!(LOCKS_EXTENDED, base.clone()),
            locks_lost: metrics::counter!(LOCKS_LOST, base.clone()),
            cancelled: metrics::counter!(SHARDS_CANCELLED, base.clone()),
            durability_confirmations: metrics::counter!(DURABILITY_CONFIRMATIONS, base.clone()),
            durability_timeouts: metrics::counter!(DURABILITY_TIMEOUTS, base.clone()),
            durability_lost: metrics::counter!(DURABILITY_LOST, base.clone()),
            backups_started: metrics::counter!(BACKUPS_STARTED, base.clone()),
            backups_won: metrics::counter!(BACKUPS_WON, base.clone()),
            backup_lost_seconds: metrics::histogram!(BACKUP_LOST_SECONDS, base.clone()),
            run_seconds: metrics::histogram!(SHARD_RUN_SECONDS, base.clone()),
            claim_seconds: metrics::histogram!(CLAIM_SECONDS, base.clone()),
            in_flight: metrics::gauge!(SHARDS_IN_FLIGHT, base.clone()),
            reconnects: metrics::counter!(REDIS_RECONNECTS, base),
        }
    }

    /// Counts a shard failed for good with `reason`.
    pub(crate) fn failed(&self, reason: &str) {
        let class = reason_class(reason);
        let i = FAILURE_CLASSES.iter().position(|c| *c == class).expect("every class is listed");
        self.failed[i].increment(1);
    }

    /// Counts a failed attempt by its class.
    pub(crate) fn attempt_failed(&self, f: Failure) {
        let i = ATTEMPT_FAILURES.iter().position(|c| *c == f.name()).expect("every class is listed");
        self.attempts_failed[i].increment(1);
    }

    /// Counts a failed Redis call if it failed on the connection (not a script's refusal).
    pub(crate) fn redis_error(&self, e: &shardctl_common::Error) {
        if e.is_retryable() {
            self.reconnects.increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_map_to_their_class() {
        let cases = [
            ("handler panicked: index out of bounds", "panic"),
            ("handler exited with status 3: boom", "exit"),
            ("handler exited with status 1", "exit"),
            ("handler was killed by signal 9", "exit"),
            ("no handler for kind squares on node n1", "no_handler"),
            ("result is 2000000 bytes; the limit is 1048576", "too_large"),
            ("handler output exceeds the limit of 1048576 bytes", "too_large"),
            ("malformed payload for kind sleep: missing field `ms`", "payload"),
            ("cancelled", "cancelled"),
            ("cancelled: handler process killed", "cancelled"),
            ("timed out after 30s", "timeout"),
            ("injected failure (rate 1, attempt 1)", "error"),
            ("cannot start handler command 'nope': No such file or directory", "error"),
            ("", "error"),
        ];
        for (reason, class) in cases {
            assert_eq!(reason_class(reason), class, "{reason:?}");
            assert!(FAILURE_CLASSES.contains(&class));
        }
    }

    #[test]
    fn every_class_is_reachable() {
        let examples = [
            "handler panicked",
            "handler exited with status 2",
            "no handler for kind k",
            "handler output exceeds the limit",
            "malformed payload",
            "cancelled",
            "timed out",
            "x",
        ];
        let mut got: Vec<&str> = examples.iter().map(|r| reason_class(r)).collect();
        got.sort_unstable();
        let mut want = FAILURE_CLASSES.to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
