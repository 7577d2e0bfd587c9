//! The smallest complete node: a handler of your own (the sum of i² over each shard's range),
//! an aggregator adding the shards up, and an executor node that runs them until SIGINT or
//! SIGTERM, with crash recovery (a SIGKILLed peer's shards come back to the nodes left).
//!
//! ```text
//! SHARDCTL_REDIS=redis://127.0.0.1:6379 cargo run --example squares
//! shardctl dispatch --kind squares --shards 100 --items 1000000 --wait
//! ```
//! `SHARDCTL_REDIS` is the Redis URL (default redis://127.0.0.1:6379), `SHARDCTL_QUEUE` the queue
//! (default `default`), `SHARDCTL_NODE_ID` names the node (default: host-pid); `SHARDCTL_LOCK_MS`
//! shortens the lock (default 30 s: a dead node's shards come back that long after its death).

use std::time::Duration;

use serde_json::{json, Value};
use shardctl::{
    AggregateContext, Aggregator, BoxFuture, Handler, Node, NodeConfig, Registry, ShardContext, ShardError,
};

struct Squares;

impl Handler for Squares {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            // an optional pause per shard ({"ms": N}), to watch a long task or kill a node mid-run
            let ms = ctx.payload_as::<Value>().ok().and_then(|p| p["ms"].as_u64()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(json!(ctx.range.map(|i| i * i).sum::<u64>()))
        })
    }
}

struct Sum;

impl Aggregator for Sum {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let mut sum = 0;
            for o in ctx.results.iter() {
                let r = o.result.as_ref().map_err(|e| ShardError::new(format!("shard {}: {e}", o.index)))?;
                // a result this aggregator cannot read is refused, never counted as 0
                sum +=
                    r.as_u64().ok_or_else(|| ShardError::new(format!("shard {} returned {r}, not a sum", o.index)))?;
            }
            Ok(json!({ "sum": sum }))
        })
    }
}

#[tokio::main]
async fn main() -> shardctl::Result<()> {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!(
            "squares: an executor node serving kind `squares` (sum of i² over each shard's items)\n\n\
             usage: cargo run --example squares\n\n\
             environment: SHARDCTL_REDIS (default redis://127.0.0.1:6379), SHARDCTL_QUEUE (default\n\
             `default`), SHARDCTL_NODE_ID (default host-pid), SHARDCTL_LOCK_MS (default 30000)\n\n\
             then: shardctl dispatch --kind squares --shards 100 --items 1000000 --wait"
        );
        return Ok(());
    }
    let env = |name: &str| std::env::var(name).ok();
    let mut registry = Registry::with_builtins();
    registry.handler("squares", Squares).aggregator("squares", Sum);
    let mut config = NodeConfig::default();
    if let Some(id) = env("SHARDCTL_NODE_ID") {
        config.executor.node_id = id;
    }
    if let Some(ms) = env("SHARDCTL_LOCK_MS").and_then(|v| v.parse().ok()) {
        config.executor.lock_duration = Duration::from_millis(ms);
        config.executor.lock_renew = Duration::from_millis(ms / 3);
    }
    let url = env("SHARDCTL_REDIS").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let queue = env("SHARDCTL_QUEUE").unwrap_or_else(|| "default".into());
    let stats = Node::connect(&url, &queue, config, registry).await?.run_until_signal().await?;
    eprintln!("stopped: {stats:?}");
    Ok(())
}
