//! The executor runtime of shardctl: claims shards in batches under token locks, keeps every
//! held lock alive with one batched heartbeat, runs each shard's handler (Rust, rayon, or a
//! child process of any language), records outcomes in batches, and shuts down gracefully.
//! It holds no maintenance duties of its own: the binary runs the coordinator's stalled sweep
//! beside it.
//!
//! # Layout
//! - [`config`]: settings, defaults, validation.
//! - [`handler`]: the [`Handler`] and [`Aggregator`] traits and their contexts.
//! - [`builtin`]: the kinds `primes`, `noop`, `sleep`, `fail` and the summary aggregator.
//! - [`registry`]: the [`Registry`] of which handler serves which kind (the built-ins and
//!   yours), and the kinds an executor claims.
//! - [`child`]: `--exec` / `--aggregate-exec`, one process per shard.
//! - [`exit_codes`]: what an `--exec` handler's exit code means (`--exit-code`).
//! - `guard`: a process that kills the handlers' process groups if the executor dies.
//! - [`commands`]: a registry whose kinds not built in are run by commands (`--exec`,
//!   `--worker` and their aggregators).
//! - [`worker`]: `--worker` / `--aggregate-worker`, long-lived processes of any language over a
//!   line protocol (docs/handlers.md).
//! - `shared`: `Shared`, the state every part of a runtime shares; defined below them all, it
//!   imports none of them (the loops import it).
//! - `runtime`: the [`Executor`]: it builds the shared state, starts the loops, and orders the
//!   shutdown.
//! - `claim`: batched claims ahead of free slots, blocking on the marker.
//! - `slots`: the run slots' state, and the claimed shards waiting for one in claim order; the
//!   budget that a node's runtimes (partitions) share.
//! - `starts`: starting waiting shards in free slots, and trimming what is held ahead.
//! - `ahead`: how many shards to claim ahead, from observed run and claim times.
//! - `run`: one shard: handler lookup, panics, cancellation, result limits.
//! - `heartbeat`: the batched lock extension and lost-lock cancellation.
//! - `cancels`: the queue's cancellation count as the heartbeat knows it.
//! - `waiter`: one blocking connection for the runtimes of a node on one server (partitions).
//! - `outcome`: how an attempt ended, and its report waiting to be recorded.
//! - `outbox`: outcomes waiting to be recorded, taken by the reporter or by the next claim
//!   (completions and a claim in one script call).
//! - `report`: batched completion (an outcome waits up to 5 ms for others), failure (with
//!   backoff) and release.
//! - `confirmer`: every completion waiting for a replica confirmed in one pipeline.
//! - `durable`: the confirmations of recorded completions and of an aggregation's claim, when the
//!   queue's durability asks for them (docs/design/durability.md).
//! - `aggregate`: reading every shard's outcome for the aggregator.
//! - `tasks`: the task metadata cache.
//! - [`stats`]: live counters.
//! - [`metrics`]: the Prometheus metrics (names, descriptions, failure classes).
//! - [`shutdown`]: SIGINT / SIGTERM.
//!
//! # Example
//! A handler of your own, registered beside the built-ins (no Redis needed to build it):
//! ```
//! use serde_json::{json, Value};
//! use shardctl_executor::{BoxFuture, Handler, Registry, ShardContext, ShardError};
//!
//! struct Squares;
//! impl Handler for Squares {
//!     fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
//!         Box::pin(async move { Ok(json!(ctx.range.map(|i| i * i).sum::<u64>())) })
//!     }
//! }
//! let mut registry = Registry::with_builtins();
//! registry.handler("squares", Squares);
//! assert!(registry.handler_for("squares").is_some());
//! assert!(registry.handler_for("unknown").is_none());
//! ```
#![warn(missing_docs)]

mod aggregate;
mod ahead;
pub mod builtin;
mod cancels;
pub mod child;
mod claim;
pub mod commands;
pub mod config;
mod confirmer;
mod durable;
pub mod exit_codes;
mod guard;
pub mod handler;
mod heartbeat;
pub mod metrics;
mod outbox;
mod outcome;
pub mod registry;
mod report;
mod run;
mod runtime;
mod shared;
pub mod shutdown;
mod slots;
mod starts;
pub mod stats;
mod tasks;
mod waiter;
pub mod worker;

pub use config::ExecutorConfig;
pub use handler::{
    run_cpu, run_cpu_of, AggregateContext, Aggregator, BoxFuture, Failure, Handler, ShardContext, ShardError,
    ShardOutcome,
};
pub use registry::Registry;
pub use runtime::{Executor, Sharing, With};
pub use stats::{Stats, StatsSnapshot};
