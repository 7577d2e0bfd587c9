//! Executor settings: plain data with `DEFAULT_*` values and one `validate()`.

use std::time::Duration;

/// Default shards run at once.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Default lock time to live.
pub const DEFAULT_LOCK_DURATION: Duration = Duration::from_secs(30);
/// Default heartbeat period.
pub const DEFAULT_LOCK_RENEW: Duration = Duration::from_secs(15);
/// Default longest blocking wait for work.
pub const DEFAULT_BLOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time in-flight shards get to finish at shutdown.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// Default most shards taken by one claim call.
pub const DEFAULT_MAX_CLAIM_BATCH: usize = 256;
/// Default most shards claimed ahead of a free slot (the executor claims fewer, or none, as the
/// run times it observes say: see `ahead.rs`).
pub const DEFAULT_PREFETCH: usize = 1024;

/// How one executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The node's identity (default: hostname-pid).
    pub node_id: String,
    /// Shards run at once.
    pub concurrency: usize,
    /// Most shards claimed ahead of a free slot: each waits, held, until a running shard ends, so
    /// the claim's round trip overlaps the work. The executor claims ahead what it would start
    /// within 20 ms at the rate it observes (none for long shards), at most this many. 0: claim
    /// only for a free slot.
    pub prefetch: usize,
    /// Lock time to live; a crashed executor's shards are recovered after it.
    pub lock_duration: Duration,
    /// Heartbeat period: every held lock is extended this often.
    pub lock_renew: Duration,
    /// Longest blocking wait for work before claiming again.
    pub block_timeout: Duration,
    /// At shutdown, time in-flight shards get to finish before they are released.
    pub grace: Duration,
    /// Most shards taken by one claim call.
    pub max_claim_batch: usize,
    /// Largest result a shard may return, in bytes of JSON.
    pub max_result_bytes: usize,
    /// Unique per process: the prefix of every lock token this executor takes (and its
    /// membership instance), so an active shard can be traced to its node.
    pub instance: String,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            node_id: default_node_id(),
            concurrency: DEFAULT_CONCURRENCY,
            prefetch: DEFAULT_PREFETCH,
            lock_duration: DEFAULT_LOCK_DURATION,
            lock_renew: DEFAULT_LOCK_RENEW,
            block_timeout: DEFAULT_BLOCK_TIMEOUT,
            grace: DEFAULT_GRACE,
            max_claim_batch: DEFAULT_MAX_CLAIM_BATCH,
            max_result_bytes: crate::child::DEFAULT_MAX_OUTPUT,
            instance: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

/// This machine's host name (`localhost` when it cannot be read).
pub fn hostname() -> String {
    shardctl_common::names::hostname()
}

/// `hostname-pid`, made a valid node id: characters of the host name outside the node-id set
/// become `-`, and a long host name is cut (see [`shardctl_common::names::node_id_from_host`]).
pub fn default_node_id() -> String {
    shardctl_common::names::node_id_from_host(&hostname(), std::process::id())
}

impl ExecutorConfig {
    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), String> {
        // the node id becomes part of keys (`node:<n>`), both of members (`leases`, tokens)
        shardctl_common::names::validate_node_id(&self.node_id).map_err(|e| e.to_string())?;
        shardctl_common::names::validate_instance(&self.instance).map_err(|e| e.to_string())?;
        if self.concurrency < 1 {
            return Err("concurrency must be at least 1".into());
        }
        if self.prefetch > 10_000 {
            return Err(format!("prefetch {} is too large: at most 10000", self.prefetch));
        }
        if self.lock_duration < Duration::from_millis(100) {
            return Err(format!("lock duration {:?} is too short: at least 100ms", self.lock_duration));
        }
        if self.lock_renew.is_zero() || self.lock_renew >= self.lock_duration {
            return Err(format!(
                "lock renew ({:?}) must be above zero and below the lock duration ({:?})",
                self.lock_renew, self.lock_duration
            ));
        }
        if self.block_timeout < Duration::from_millis(10) {
            return Err("block timeout must be at least 10ms".into());
        }
        if self.max_claim_batch < 1 {
            return Err("max claim batch must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_pairs_do_not() {
        assert!(ExecutorConfig::default().validate().is_ok());
        let c = ExecutorConfig { lock_renew: DEFAULT_LOCK_DURATION, ..Default::default() };
        assert!(c.validate().unwrap_err().contains("below the lock duration"));
        let c = ExecutorConfig { concurrency: 0, ..Default::default() };
        assert!(c.validate().is_err());
    }

    #[test]
    fn node_ids_and_instances_that_would_form_other_keys_are_refused() {
        for node in ["a:wait", "n{x}", "", "a b", "é"] {
            let c = ExecutorConfig { node_id: node.into(), ..Default::default() };
            assert!(c.validate().unwrap_err().starts_with("node id"), "{node:?}");
        }
        for instance in ["a:1", "i}", ""] {
            let c = ExecutorConfig { instance: instance.into(), ..Default::default() };
            assert!(c.validate().unwrap_err().starts_with("executor instance id"), "{instance:?}");
        }
        assert!(shardctl_common::names::validate_node_id(&default_node_id()).is_ok());
    }
}
