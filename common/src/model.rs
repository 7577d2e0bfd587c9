//! The task model: what a dispatch asks for ([`TaskSpec`]); what a task hash holds
//! ([`TaskInfo`], [`Share`]), its refs ([`ShardRef`]) and states ([`TaskState`]) have files of
//! their own, re-exported here.

use crate::backoff::Backoff;
use crate::error::Error;
use crate::ring::{Strategy, DEFAULT_VNODES};

/// Largest task payload, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Most shards a task may have: the terminal bitmap addresses 2^32 bits.
pub const MAX_SHARDS: u64 = 1 << 32;
/// Priorities range over ±this (the runnable-task score keeps submission order exactly).
pub const MAX_PRIORITY: i64 = 1_000_000;
/// Highest weight a task may have (docs/design/fairness.md).
pub const MAX_WEIGHT: u32 = 1000;
/// Most attempts per shard (a retry numbers its attempts on past n × attempts).
pub const MAX_ATTEMPTS: u32 = 10_000;
/// How long an ended task's keys are kept by default: 7 days.
pub const DEFAULT_RETAIN: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// Default number of attempts per shard.
pub const DEFAULT_ATTEMPTS: u32 = 3;

// the rule lives in `names`, with every other name's; re-exported where it always was
pub use crate::names::{validate_task_id, MAX_TASK_ID_LEN};

pub use crate::shard_ref::{Job, ShardRef};
pub use crate::task_info::{Share, TaskInfo};
pub use crate::task_state::TaskState;

/// What a dispatch asks for.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    /// Task id ([`validate_task_id`]).
    pub id: String,
    /// Which handler runs the shards.
    pub kind: String,
    /// Number of shards (≥ 1).
    pub shards: u64,
    /// Number of items split over the shards (≥ shards).
    pub items: u64,
    /// The task payload, JSON text.
    pub payload: String,
    /// Attempts per shard (≥ 1).
    pub attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// Higher runs first.
    pub priority: i64,
    /// Its share of the run slots among the tasks of its priority (and group), in proportion to
    /// the others' weights (docs/design/fairness.md); 1 to [`MAX_WEIGHT`].
    pub weight: u32,
    /// The group it shares with (a tenant, a team): fairness is first between groups, then
    /// between the tasks of one; `None`: a group of its own.
    pub group: Option<String>,
    /// At most this many of its shards are held (running, or claimed to run next) at once
    /// across the cluster; `None`: no cap.
    pub max_running: Option<u64>,
    /// Once more of its shards than this have failed for good, the task fails at once (its
    /// running shards stopped, no aggregation): docs/design/failure-policies.md; `None`: no limit.
    pub max_failures: Option<crate::failure::Threshold>,
    /// Once this many of its shards (or this share of them, rounded up) completed, its other
    /// shards are cancelled and it aggregates (k-of-n, docs/design/failure-policies.md);
    /// `None`: every shard runs.
    pub success_when: Option<crate::failure::Threshold>,
    /// Backup attempts for straggling shards, at most this many (or this share of its shards,
    /// rounded up, at least 1): docs/design/speculation.md; `None`: none. Pull tasks only.
    pub speculate: Option<crate::failure::Threshold>,
    /// How shards are placed on executors.
    pub strategy: Strategy,
    /// Virtual nodes per executor on the ring (consistent hash).
    pub vnodes: u32,
    /// Shard keys are stored in `task:<id>:keys` (a keys file), not derived from the index.
    pub has_keys: bool,
    /// An attempt running longer is cancelled and fails with "timed out"; `None`: no limit.
    pub shard_timeout: Option<std::time::Duration>,
    /// Nothing is claimable until this long after the dispatch, by the Redis server's clock;
    /// `None`: at once.
    pub delay: Option<std::time::Duration>,
    /// Per-shard results stay after the aggregation (else only its result does).
    pub keep_results: bool,
    /// How long the task's keys stay once it ended; `None`: until `shardctl clean`.
    pub retain: Option<std::time::Duration>,
}

impl TaskSpec {
    /// Whether task record `t` was dispatched with this spec (what a dispatch run again after
    /// it was cut short must match to resume it): every field the record keeps of it.
    pub fn matches(&self, t: &TaskInfo) -> bool {
        t.kind == self.kind
            && t.total == self.shards
            && t.items == self.items
            && t.strategy == self.strategy.as_str()
            && t.payload == self.payload
            && t.attempts == self.attempts
            && t.backoff == self.backoff.to_string()
            && t.vnodes == self.vnodes
            && t.has_keys == self.has_keys
            && t.keep_results == self.keep_results
            && t.shard_timeout_ms == self.shard_timeout.map_or(0, |d| d.as_millis() as u64)
            && t.retain_ms == self.retain.map_or(0, |d| d.as_millis() as u64)
            && t.weight == self.weight
            && t.group == self.group
            && t.max_running == self.max_running
            && t.max_failures == self.max_failures.map(|m| m.of(self.shards))
            && t.success_when == self.success_when.map(|m| m.at_least(self.shards))
            && t.speculate == self.speculate.map(|m| m.at_least(self.shards))
    }

    /// A spec with defaults for everything but id, kind and shard count.
    pub fn new(id: impl Into<String>, kind: impl Into<String>, shards: u64) -> Self {
        TaskSpec {
            id: id.into(),
            kind: kind.into(),
            shards,
            items: shards,
            payload: "null".into(),
            attempts: DEFAULT_ATTEMPTS,
            backoff: Backoff::default(),
            priority: 0,
            weight: 1,
            group: None,
            max_running: None,
            max_failures: None,
            success_when: None,
            speculate: None,
            strategy: Strategy::Pull,
            vnodes: DEFAULT_VNODES,
            has_keys: false,
            shard_timeout: None,
            delay: None,
            keep_results: true,
            retain: Some(DEFAULT_RETAIN),
        }
    }

    /// Checks every field; the message says what is wrong and what is allowed.
    pub fn validate(&self) -> Result<(), Error> {
        validate_task_id(&self.id)?;
        crate::names::validate_kind(&self.kind)?;
        if self.shards < 1 {
            return Err(Error::invalid("shards must be at least 1"));
        }
        if self.shards > MAX_SHARDS {
            return Err(Error::invalid(format!("shards must be at most {MAX_SHARDS} (2^32), got {}", self.shards)));
        }
        if self.items < self.shards {
            return Err(Error::invalid(format!(
                "items ({}) must be at least the number of shards ({})",
                self.items, self.shards
            )));
        }
        if self.vnodes < 1 || self.vnodes > 10_000 {
            return Err(Error::invalid(format!("vnodes must be 1 to 10000, got {}", self.vnodes)));
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return Err(Error::invalid(format!("weight must be 1 to {MAX_WEIGHT}, got {}", self.weight)));
        }
        if let Some(g) = &self.group {
            crate::names::validate_group(g)?;
        }
        if let Some(k) = self.success_when.map(|m| m.at_least(self.shards)) {
            if k < 1 || k > self.shards {
                return Err(Error::invalid(format!(
                    "success-when must stand for 1 to the task's {} shards, got {k}",
                    self.shards
                )));
            }
        }
        if self.speculate.is_some_and(|m| m.at_least(self.shards) < 1) {
            return Err(Error::invalid("--speculate must allow at least 1 backup"));
        }
        if self.speculate.is_some() && self.strategy != Strategy::Pull {
            return Err(Error::invalid(
                "--speculate needs the pull strategy: a routed shard belongs on its key's node, a backup would run elsewhere",
            ));
        }
        if self.max_running == Some(0) {
            return Err(Error::invalid("max-running must be at least 1"));
        }
        if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(Error::invalid(format!("priority must be within -{MAX_PRIORITY}..={MAX_PRIORITY}")));
        }
        for (what, d) in [("shard timeout", self.shard_timeout), ("retention", self.retain), ("delay", self.delay)] {
            if d.is_some_and(|d| d > crate::time::MAX_DURATION) {
                return Err(Error::invalid(format!("{what} must be at most 100 years")));
            }
        }
        if self.attempts > MAX_ATTEMPTS {
            return Err(Error::invalid(format!("attempts must be at most {MAX_ATTEMPTS}, got {}", self.attempts)));
        }
        if self.shard_timeout.is_some_and(|d| d < std::time::Duration::from_millis(1)) {
            return Err(Error::invalid("shard timeout must be at least 1ms"));
        }
        if self.retain.is_some_and(|d| d < std::time::Duration::from_secs(1)) {
            return Err(Error::invalid("retention must be at least 1s (or 'forever')"));
        }
        if self.attempts < 1 {
            return Err(Error::invalid("attempts must be at least 1"));
        }
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::invalid(format!(
                "payload is {} bytes; the limit is {MAX_PAYLOAD_BYTES} (1 MiB)",
                self.payload.len()
            )));
        }
        serde_json::from_str::<serde_json::Value>(&self.payload)
            .map_err(|e| Error::invalid(format!("payload is not valid JSON: {e}")))?;
        Ok(())
    }

    /// The field/value pairs stored in the task hash at dispatch.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = vec![
            ("kind", self.kind.clone()),
            ("total", self.shards.to_string()),
            ("items", self.items.to_string()),
            ("payload", self.payload.clone()),
            ("strategy", self.strategy.as_str().into()),
            ("vnodes", self.vnodes.to_string()),
            ("has_keys", u8::from(self.has_keys).to_string()),
            ("shard_timeout_ms", self.shard_timeout.map_or(0, |d| d.as_millis() as u64).to_string()),
            ("attempts", self.attempts.to_string()),
            ("backoff", self.backoff.to_string()),
            ("priority", self.priority.to_string()),
            ("weight", self.weight.to_string()),
            ("keep_results", u8::from(self.keep_results).to_string()),
            ("retain_ms", self.retain.map_or(0, |d| d.as_millis() as u64).to_string()),
            // each record its own incarnation id (docs/design/partitions.md)
            ("nonce", crate::incarnation::nonce()),
        ];
        if let Some(g) = &self.group {
            f.push(("group", g.clone()));
        }
        if let Some(n) = self.max_running {
            f.push(("max_running", n.to_string()));
        }
        if let Some(m) = self.max_failures {
            f.push(("max_failures", m.of(self.shards).to_string()));
        }
        if let Some(m) = self.success_when {
            f.push(("success_when", m.at_least(self.shards).to_string()));
        }
        if let Some(m) = self.speculate {
            f.push(("speculate", m.at_least(self.shards).to_string()));
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids() {
        assert!(validate_task_id("nightly-report_2026.11.30").is_ok());
        assert!(validate_task_id("").is_err());
        assert!(validate_task_id(&"a".repeat(65)).is_err());
        assert!(validate_task_id(&"a".repeat(64)).is_ok());
        let e = validate_task_id("a:b").unwrap_err().to_string();
        assert!(e.contains("':'"), "{e}");
        assert!(validate_task_id("a b").is_err());
        assert!(validate_task_id("é").is_err());
    }

    #[test]
    fn spec_validation_messages() {
        let mut s = TaskSpec::new("t", "primes", 10);
        assert!(s.validate().is_ok());
        s.items = 5;
        assert!(s.validate().unwrap_err().to_string().contains("at least the number of shards"));
        s.items = 10;
        s.payload = "{nope".into();
        assert!(s.validate().unwrap_err().to_string().contains("not valid JSON"));
        s.payload = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES));
        assert!(s.validate().unwrap_err().to_string().contains("1 MiB"));
        s.payload = "{}".into();
        s.shards = 0;
        s.items = 0;
        assert!(s.validate().unwrap_err().to_string().contains("at least 1"));
    }
}
