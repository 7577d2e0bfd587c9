//! The coordinating side of shardctl: creating tasks, the maintenance duties any process may
//! run (the stalled sweep, promotion, rebalancing), reading progress, and the coordinator daemon
//! that exports it to Prometheus. It never depends on the executor crate; the `shardctl executor`
//! command runs the sweep beside the executor runtime, so no single process is needed for
//! correctness.
//!
//! # Layout
//! - [`dispatch`]: validating and creating a pull task, fresh task ids.
//! - [`sweep`]: the stalled-shard sweep loop: at each executor lease's expiry, and Bull's full
//!   sweep throttled in Redis.
//! - [`liveness`]: whether a node id's holder is provably dead (a restart after a crash).
//! - [`membership`]: executors joining, heartbeating and leaving; the live node set.
//! - [`route`]: owners of routed refs, chunked placement of a task, moving a list's refs.
//! - [`rebalance`]: failover and rebalancing under a short lock.
//! - [`firing`]: firing due cron schedules (each fire time's task created once); the
//!   schedules themselves are stored by `shardctl_common::schedule`.
//! - [`partition`]: tasks over a partitioned queue: dispatch as a home record and shares, the
//!   report of ended shares to the home, the home's decisions on failure limits and success
//!   goals, orphaned shares removed.
//! - [`progress`]: one task's state and counts, a queue's counts, failed shards.
//! - [`inspect`]: bounded reads for the dashboard: task pages, reason pages.
//! - [`shard_map`]: a task's shards as cells for the dashboard.
//! - [`failures`]: a task's failures grouped by cause, with when, where and at which attempt.
//! - [`events`]: the event log read as one over the partitions: its newest events, or followed
//!   live (`shardctl watch`).
//! - [`wait`]: waiting for a task to end, with a progress callback.
//! - [`confirm`]: a task's end confirmed before `wait` returns it, when the queue's durability
//!   asks; the durability `status` shows.
//! - [`stuck`]: why a task is not moving (paused, delayed, no executor, rate limit).
//! - [`presence`]: coordinators announcing themselves (`status` lists them).
//! - [`daemon`]: `shardctl coordinator`: maintenance every refresh, schedules, progress for the
//!   metrics.
//! - [`metrics`]: the Prometheus metrics (names, descriptions, publishing the progress gauges).
//! - [`snapshot`]: one reading of a queue's progress for those gauges.
//!
//! # Example
//! ```
//! let id = shardctl_coordinator::dispatch::new_task_id();
//! assert!(shardctl_common::model::validate_task_id(&id).is_ok());
//! ```
#![warn(missing_docs)]

pub mod confirm;
pub mod daemon;
pub mod dispatch;
pub mod events;
pub mod failures;
pub mod firing;
pub mod inspect;
pub mod liveness;
pub mod membership;
pub mod metrics;
pub mod partition;
pub mod presence;
pub mod progress;
pub mod rebalance;
pub mod route;
pub mod shard_map;
pub mod snapshot;
pub mod stuck;
pub mod sweep;
pub mod wait;
