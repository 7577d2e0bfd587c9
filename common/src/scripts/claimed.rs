//! [`Claimed`]: a shard as an executor holds it, what a claim returns and a finish reports.

use std::sync::Arc;

use crate::model::ShardRef;

/// One shard handed to an executor by [`claim`](super::claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Which shard.
    pub shard_ref: ShardRef,
    /// The token that holds its lock.
    pub token: String,
    /// Claims of this shard so far, this one included (1 on the first).
    pub attempt: u32,
    /// Failed attempts so far.
    pub fails: u32,
    /// Its task record's incarnation id at the claim (`inc`, `<seq>.<nonce>`; empty for a record
    /// written before it had one): what the executor's task cache compares, whole.
    pub task_inc: Arc<str>,
    /// A backup attempt of a straggling shard (docs/design/speculation.md): held in `backups`,
    /// its shard's first attempt running elsewhere.
    pub backup: bool,
}

impl Claimed {
    /// True when the shard may have state in `task:<id>:shards` to remove with it.
    pub fn has_state(&self) -> bool {
        self.shard_ref.is_aggregate() || self.attempt > 1 || self.fails > 0
    }
}
