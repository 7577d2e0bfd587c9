//! The data layer of shardctl: everything that reads or writes Redis for one operation, and the
//! types those operations share. Key names, the Lua scripts and their typed calls, the task
//! model, the operator's controls (each one script call or a few writes: cancel, retry, clean,
//! pause, limits, schedules), locks and rate limiters for users' own code, connections, errors,
//! the one retry policy. No loops live here: the coordinator and the executor (and the `shardctl`
//! library's `Node`) decide *when* to call what is here. The rate limiters are a library for
//! handlers and other programs; the queue's own rate limit is enforced inside `claim.lua`,
//! where starts are counted atomically with claims.
//!
//! # Layout
//! - [`keys`]: every Redis key name of a queue, built in one place under the queue's hash tag.
//! - [`home`]: a queue's home keyspace, the one type functions that need the home take; a
//!   partition's keys are made from it.
//! - [`scripts`]: the registry of Lua scripts (one per atomic operation) and their typed calls.
//! - [`control`]: cancel and clean tasks; pause and resume; the queue's settings; the
//!   queue-wide rate limit.
//! - [`retry`]: a task's failed shards run again, over each of its partitions in one round.
//! - [`cron`]: cron expressions and their fire times in IANA time zones.
//! - [`lock`]: distributed locks, single Redis and Redlock, with fencing tokens, and the one
//!   renewal loop (`watchdog`).
//! - [`limiter`]: fixed-window, sliding-log and token-bucket rate limiters.
//! - [`incarnation`]: the incarnation id no failover reissues, the dispatch lease.
//! - [`model`]: task ids, the task spec, a task record and a share as read.
//! - [`shard_ref`]: refs, `<task>:<seq>:<index>` or `<task>:<seq>:agg`.
//! - [`task_info`]: a task as read back from its hash, and a share's marks.
//! - [`task_state`]: a task's lifecycle state.
//! - [`durations`]: a task's shard run times: its histogram, percentiles and buckets.
//! - [`throughput`]: a task's completions over time, in buckets that widen as it runs.
//! - [`names`]: the rules for every user-given name in a key (queues, prefix, task and node ids,
//!   instances, schedules, locks): one rule per kind, and why no two names make one key.
//! - [`kinds`]: the kinds an executor serves (every kind, or a set), as claims and the
//!   membership carry them, and the lanes that hold each kind's ready work.
//! - [`schedule`]: cron schedules fired once per fire time by any number of coordinators.
//! - [`schedule_policy`]: a schedule's overlap and misfire policies.
//! - [`ring`]: consistent hashing with virtual nodes, the static strategies, `ring simulate`.
//! - [`split`]: balanced item ranges of shards.
//! - [`partition`]: a queue's partitions: their [`Layout`](partition::Layout) (`layout`), their
//!   tags chosen over a cluster's masters (`placement`), a task's shares created at dispatch
//!   (`spread`).
//! - [`queues`]: every queue of a prefix, in one set the processes that work them add to.
//! - [`share`]: the share-reading rule (a share is its task's only under its home's `inc`).
//! - [`slot`]: Redis Cluster hash slots of keys.
//! - [`backoff`]: retry delays (fixed or exponential, with jitter): the one retry policy and the
//!   one source of jitter.
//! - [`durability`]: a queue's durability mode and the confirmation, the one way a process learns
//!   that a state it read reached a replica.
//! - [`conn`]: connecting to Redis (one server or a cluster), a dedicated connection for blocking
//!   waits.
//! - [`reason`]: a failure reason's summary (message and frame) and shape (numbers and ids folded).
//! - [`failure`]: what a failed attempt means ([`failure::Failure`]), a task's failure limit.
//! - [`redis_url`]: single-server and `redis+cluster://` URLs, and their redacted form.
//! - [`error`]: the error enum and the script error codes.
//! - [`time`]: wall-clock milliseconds and duration parsing.
//!
//! # Example
//! ```
//! use shardctl_common::split::shard_range;
//! // 10 items over 3 shards: lengths differ by at most one and cover [0, 10)
//! assert_eq!(shard_range(0, 3, 10), 0..4);
//! assert_eq!(shard_range(1, 3, 10), 4..7);
//! assert_eq!(shard_range(2, 3, 10), 7..10);
//! ```
#![warn(missing_docs)]

pub mod backoff;
pub mod conn;
pub mod control;
pub mod cron;
pub mod durability;
pub mod durations;
pub mod error;
pub mod failure;
pub mod home;
pub mod incarnation;
pub mod keys;
pub mod kinds;
pub mod limiter;
pub mod lock;
pub mod model;
pub mod names;
pub mod partition;
pub mod queues;
pub mod reason;
pub mod redis_url;
pub mod retry;
pub mod ring;
pub mod schedule;
pub mod schedule_policy;
pub mod script_texts;
pub mod scripts;
pub mod shard_ref;
pub mod share;
pub mod slot;
pub mod split;
pub mod task_info;
pub mod task_state;
pub mod throughput;
pub mod time;

pub use error::{Error, Result, ScriptCode};
pub use home::Home;
pub use keys::Keys;
