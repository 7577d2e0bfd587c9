//! Every Redis key name of a queue, built in one place. All share the hash tag `{P:Q}`, so a
//! queue lives in one Redis Cluster slot and every script is atomic there. Scripts derive
//! per-shard and per-task keys from [`Keys::prefix`], which carries the tag too.

use crate::error::Result;
use crate::names;

/// The one field of the `active` hash that is not a shard: it keeps the hash in hashtable
/// encoding (see `lua/include/hold.lua`).
pub const ACTIVE_PIN: &str = "~pin";

/// The key names of one queue under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
    queue: String,
}

impl Keys {
    /// Keys of queue `queue` under `prefix` (default `shardctl`); both must follow their rules in
    /// [`crate::names`] (`Error::Invalid` otherwise), so that no two queues share a key or a slot.
    pub fn new(prefix: &str, queue: &str) -> Result<Self> {
        names::validate_prefix(prefix)?;
        names::validate_queue(queue)?;
        Ok(Keys { prefix: format!("{{{prefix}:{queue}}}:"), queue: queue.to_owned() })
    }

    /// The keys under hash tag `tag` (without braces) of queue `queue`: a partition's keys, made
    /// and checked by [`crate::home::Home::partition`] only.
    pub(crate) fn with_tag(tag: &str, queue: &str) -> Self {
        Keys { prefix: format!("{{{tag}}}:"), queue: queue.to_owned() }
    }

    /// The queue's name (the `queue` label of metrics).
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// `{P:Q}:`, the start of every key of the queue.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The hash tag of every key of the keyspace: `P:Q` of `{P:Q}:`, a slot's name on a cluster.
    pub fn tag(&self) -> &str {
        self.prefix.strip_prefix('{').and_then(|p| p.strip_suffix("}:")).unwrap_or(&self.prefix)
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// Hash: paused flag, submission sequence.
    pub fn meta(&self) -> String {
        self.key("meta")
    }
    /// Zset: every task of the queue by creation time.
    pub fn index(&self) -> String {
        self.key("index")
    }
    /// Hash: one task.
    pub fn task(&self, id: &str) -> String {
        self.key(&format!("task:{id}"))
    }
    /// String (bitmap): bit i set when shard i is terminal.
    pub fn terminal(&self, id: &str) -> String {
        self.key(&format!("task:{id}:terminal"))
    }
    /// Hash: shard index → result JSON.
    pub fn results(&self, id: &str) -> String {
        self.key(&format!("task:{id}:results"))
    }
    /// Hash: shard index → last failure reason.
    pub fn errors(&self, id: &str) -> String {
        self.key(&format!("task:{id}:errors"))
    }
    /// List: refs a version before lanes queued; moved to lanes by `move_legacy.lua`.
    pub fn legacy_wait(&self) -> String {
        self.key("wait")
    }
    /// Zset: runnable tasks a version before lanes queued; moved to lanes by `move_legacy.lua`.
    pub fn legacy_tasks(&self) -> String {
        self.key("tasks")
    }
    /// Set: the kinds that may have a lane (docs/design/lanes.md).
    pub fn kinds(&self) -> String {
        self.key("kinds")
    }
    /// List: explicit refs of tasks of kind `kind` ready now (released, recovered, due retries,
    /// aggregation jobs). `kind` follows [`crate::names::validate_kind`].
    pub fn lane_wait(&self, kind: &str) -> String {
        self.key(&format!("kind:{kind}:wait"))
    }
    /// Zset: runnable pull tasks of kind `kind` (cursor not exhausted), by priority then
    /// submission.
    pub fn lane_tasks(&self, kind: &str) -> String {
        self.key(&format!("kind:{kind}:tasks"))
    }
    /// Zset: wakes blocked executors that serve `kind`.
    pub fn lane_marker(&self, kind: &str) -> String {
        self.key(&format!("kind:{kind}:marker"))
    }
    /// Zset: wakes blocked executors that serve every kind (`--kinds '*'`); `*` is no name
    /// character, so no kind's marker is this key.
    pub fn any_kind_marker(&self) -> String {
        self.key("kind:*:marker")
    }
    /// Zset: ref → due time.
    pub fn delayed(&self) -> String {
        self.key("delayed")
    }
    /// Hash: ref → token of its holder (`<instance>:<seq>`): the shards being run.
    pub fn active(&self) -> String {
        self.key("active")
    }
    /// Hash: held index shards per task (`<id>`) and per group (`g:<name>`), what fair sharing
    /// and caps decide by (docs/design/fairness.md); rebuilt from `active` by every sweep.
    pub fn held(&self) -> String {
        self.key("held")
    }
    /// Zset: executor instance → its lease's expiry (ms, Redis's clock); while it has not passed,
    /// the shards its tokens hold are not stalled.
    pub fn leases(&self) -> String {
        self.key("leases")
    }
    /// Zset: tasks not finished, by creation time.
    pub fn running(&self) -> String {
        self.key("running")
    }
    /// Zset: finished tasks, by end time.
    pub fn finished(&self) -> String {
        self.key("finished")
    }
    /// Stream: the best-effort event log.
    pub fn events(&self) -> String {
        self.key("events")
    }
    /// Set: stall candidates of the last sweep.
    pub fn stalled(&self) -> String {
        self.key("stalled")
    }
    /// String PX: the sweep throttle.
    pub fn stalled_check(&self) -> String {
        self.key("stalled-check")
    }
    /// Zset: ref → claim ms of the held first attempts of tasks with `--speculate`
    /// (docs/design/speculation.md).
    pub fn speculating(&self) -> String {
        self.key("speculating")
    }
    /// Hash: ref → token of a shard's backup attempt (docs/design/speculation.md).
    pub fn backups(&self) -> String {
        self.key("backups")
    }
    /// String PX (a home's): the throttle of the decision pass over partitions.
    pub fn decide_check(&self) -> String {
        self.key("decide-check")
    }
    /// Hash: the per-shard state of one task's shards, fields `<index>:attempt`, `:fails`,
    /// `:stalled`, `:node` (and `agg:*`), only while a shard needs them.
    pub fn shards(&self, id: &str) -> String {
        self.key(&format!("task:{id}:shards"))
    }
    /// Zset: wakes blocked executors.
    pub fn marker(&self) -> String {
        self.key("marker")
    }

    /// Hash: shard index → shard key, for tasks dispatched with a keys file.
    pub fn shard_keys(&self, id: &str) -> String {
        self.key(&format!("task:{id}:keys"))
    }
    /// Zset: executors, node id → alive until (ms, the server's clock): its last membership
    /// heartbeat plus its own member timeout.
    pub fn nodes(&self) -> String {
        self.key("nodes")
    }
    /// Zset: coordinators, `<host>-<pid>` → alive until (ms, the server's clock).
    pub fn coordinators(&self) -> String {
        self.key("coordinators")
    }
    /// Hash: one executor's host, pid, concurrency, version, instance.
    pub fn node(&self, node: &str) -> String {
        self.key(&format!("node:{node}"))
    }
    /// List: refs routed to one node.
    pub fn node_wait(&self, node: &str) -> String {
        self.key(&format!("node:{node}:wait"))
    }
    /// Zset: wakes one node's executor when refs are routed to it.
    pub fn node_marker(&self, node: &str) -> String {
        self.key(&format!("node:{node}:marker"))
    }
    /// Set: nodes that may have a routed list (for the rebalancer to find departed ones).
    pub fn routed_nodes(&self) -> String {
        self.key("routed-nodes")
    }
    /// List: recovered or released refs of routed tasks, to be placed by the current ring.
    pub fn reroute(&self) -> String {
        self.key("reroute")
    }
    /// Zset: routed tasks not yet fully placed (task id → creation ms).
    pub fn unrouted(&self) -> String {
        self.key("unrouted")
    }
    /// String PX: one rebalancer at a time.
    pub fn rebalance_lock(&self) -> String {
        self.key("rebalance-lock")
    }
    /// String PX: set while live nodes' lists are re-placed; claims leave node lists alone.
    pub fn rebalancing(&self) -> String {
        self.key("rebalancing")
    }

    /// Zset: delayed tasks (`dispatch --delay`), task id → start time (ms).
    pub fn scheduled(&self) -> String {
        self.key("scheduled")
    }
    /// Zset: ended tasks with a retention, task id → expiry time (ms).
    pub fn expiring(&self) -> String {
        self.key("expiring")
    }
    /// Zset: the queue-wide rate limit's log, one entry `<token>|<k>` per claim call that started
    /// k shards → Redis time (µs); `meta.limit_used` is the sum of k.
    pub fn limiter(&self) -> String {
        self.key("limiter")
    }
    /// Hash: cron schedules, name → schedule JSON.
    pub fn schedules(&self) -> String {
        self.key("schedules")
    }
    /// Hash: per schedule, `<name>:last` (last handled fire time, ms) and `<name>:task`.
    pub fn schedule_state(&self) -> String {
        self.key("schedule-state")
    }

    /// Zset (in a partition): tasks whose share there ended and is not yet counted in the home,
    /// task id → when it ended (ms).
    pub fn unreported(&self) -> String {
        self.key("unreported")
    }

    /// Hash: durability confirms of this slot (docs/design/durability.md): `n`, the confirms made
    /// (each one increments it, so that its `WAIT` has a write to wait for); `since`, when the
    /// first of the confirms that timed out since the last success did (server ms).
    pub fn durable(&self) -> String {
        self.key("durable")
    }

    /// Every key a task owns (for removal; the same list as `task_keys` in lua/include/task.lua).
    pub fn task_keys(&self, id: &str) -> [String; 6] {
        [self.task(id), self.terminal(id), self.results(id), self.errors(id), self.shard_keys(id), self.shards(id)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let k = Keys::new("shardctl", "default").unwrap();
        assert_eq!(k.lane_wait("primes"), "{shardctl:default}:kind:primes:wait");
        assert_eq!(k.queue(), "default");
        assert_eq!(k.leases(), "{shardctl:default}:leases");
        assert_eq!(k.terminal("t1"), "{shardctl:default}:task:t1:terminal");
    }

    #[test]
    fn new_refuses_names_that_would_leave_the_hash_tag() {
        // the full proof by enumeration is common/tests/names.rs
        for (prefix, queue) in
            [("shardctl", "a}b"), ("shardctl", "a:b"), ("a:b", "q"), ("s{", "q"), ("", "q"), ("p", "")]
        {
            let e = Keys::new(prefix, queue).unwrap_err();
            assert!(matches!(e, crate::Error::Invalid(_)), "{prefix:?} {queue:?}: {e}");
        }
    }
}
