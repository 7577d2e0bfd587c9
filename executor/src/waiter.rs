//! One blocking connection for every runtime of a node on one Redis server (the runtimes of a
//! partitioned queue, ARCHITECTURE.md "Partitioned queues"): a single `BZPOPMIN` names every
//! runtime's markers, and a marker popped wakes the runtime it belongs to. On a Redis Cluster
//! each partition is a slot of its own, and one command cannot name keys of two slots, so there
//! each runtime keeps its own blocking connection (partitions sit on distinct masters while
//! there are enough, so that is one per master).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardctl_common::conn::Endpoint;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A runtime's markers and what wakes it.
struct Member {
    markers: Vec<String>,
    wake: Arc<Notify>,
    routing: Arc<Notify>,
}

/// The node's waiter: runtimes join it, then [`Waiter::run`] blocks for all of them.
#[derive(Default)]
pub(crate) struct Waiter {
    members: Mutex<Vec<Member>>,
}

impl Waiter {
    /// Adds a runtime: `markers` are the keys it would block on, `wake` is notified when one is
    /// popped (`routing` too when the member popped is `route`).
    pub(crate) fn join(&self, markers: Vec<String>, wake: Arc<Notify>, routing: Arc<Notify>) {
        self.members.lock().unwrap().push(Member { markers, wake, routing });
    }

    /// Blocks on every member's markers until `stop`, waking the owner of each marker popped.
    /// A connection error is retried after a second (the runtimes meanwhile poll on their own
    /// timers: they wait at most the block timeout).
    pub(crate) async fn run(self: Arc<Self>, endpoint: Endpoint, block: Duration, stop: CancellationToken) {
        let mut con = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            if con.is_none() {
                match endpoint.blocking(block).await {
                    Ok(c) => con = Some(c),
                    Err(e) => {
                        tracing::warn!("the node's blocking connection: {e}");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                            _ = stop.cancelled() => return,
                        }
                    }
                }
            }
            let c = con.as_mut().expect("just set");
            let keys: Vec<String> = self.members.lock().unwrap().iter().flat_map(|m| m.markers.clone()).collect();
            let mut cmd = redis::cmd("BZPOPMIN");
            cmd.arg(&keys).arg(block.as_secs_f64().max(0.01));
            let popped: redis::RedisResult<Option<(String, String, f64)>> = tokio::select! {
                r = cmd.query_async(c) => r,
                _ = stop.cancelled() => return,
            };
            match popped {
                Ok(Some((key, member, _))) => {
                    let members = self.members.lock().unwrap();
                    if let Some(m) = members.iter().find(|m| m.markers.contains(&key)) {
                        m.wake.notify_one();
                        if member == "route" {
                            m.routing.notify_one();
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("blocking on the markers: {e}");
                    con = None;
                }
            }
        }
    }
}
