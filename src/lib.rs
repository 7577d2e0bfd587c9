//! shardctl as a library: split one large batch task into shards and run them on many machines,
//! coordinated through Redis. A program of your own embeds an executor [`Node`] with its own
//! handlers, and dispatches and waits for tasks with [`dispatch`] and [`wait`].
//!
//! # Layout
//! - [`node`]: [`Node`], an executor node assembled from a handler registry and a config
//!   (executor runtime, membership and rebalancing, stalled sweep, metrics, graceful shutdown).
//! - [`coordinate`]: [`Coordinator`], a queue's coordinator assembled from a config (the
//!   daemon's upkeep, its metrics, the dashboard).
//! - [`metrics`]: the Prometheus exporter (`GET /metrics`).
//! - [`locked`]: running a command under a distributed lock (`shardctl lock`).
//! - [`dashboard`]: the coordinator's web dashboard and its JSON API.
//! - [`json`]: the JSON shapes shared by `--json` outputs and the dashboard's API.
//! - [`text`]: the plain-text shapes of the CLI's outputs (a task's line, a queue's summary,
//!   an event, a schedule, the failure reasons of a task).
//! - [`units`]: durations and rates as people read them.
//! - The crates underneath, re-exported: [`common`] (keys, scripts, model, connections),
//!   [`executor`] (the runtime, handlers, built-in kinds), [`coordinator`] (dispatch, sweep,
//!   membership, progress, the coordinator daemon).
//!
//! The `shardctl` binary (`src/main.rs`, `src/cli/`) parses arguments and prints; it calls
//! these crates for everything else, and the `shardctl-bench` crate (`bench/`) for `shardctl
//! bench`. Both come with the default feature `cli`; an embedding program takes this library
//! with `default-features = false` and builds neither.
//!
//! # Example
//! A node running a handler of your own beside the built-in kinds, until SIGINT or SIGTERM:
//! ```no_run
//! use serde_json::{json, Value};
//! use shardctl::{BoxFuture, Handler, Node, NodeConfig, Registry, ShardContext, ShardError};
//!
//! struct Squares;
//! impl Handler for Squares {
//!     fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
//!         Box::pin(async move { Ok(json!(ctx.range.map(|i| i * i).sum::<u64>())) })
//!     }
//! }
//!
//! # async fn main_() -> shardctl::Result<()> {
//! let mut registry = Registry::with_builtins();
//! registry.handler("squares", Squares);
//! let node = Node::connect("redis://127.0.0.1:6379", "default", NodeConfig::default(), registry).await?;
//! node.run_until_signal().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod coordinate;
pub mod dashboard;
pub mod json;
pub mod locked;
pub mod metrics;
pub mod node;
pub mod text;
pub mod units;

pub use coordinate::{Coordinator, CoordinatorConfig};
pub use node::{Node, NodeConfig};
pub use shardctl_common::model::TaskSpec;
pub use shardctl_common::{Error, Home, Keys, Result};
pub use shardctl_coordinator::{dispatch, wait};
pub use shardctl_executor::{
    AggregateContext, Aggregator, BoxFuture, ExecutorConfig, Failure, Handler, Registry, ShardContext, ShardError,
    StatsSnapshot,
};
pub use {shardctl_common as common, shardctl_coordinator as coordinator, shardctl_executor as executor};
