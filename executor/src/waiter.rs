//! One blocking connection for every runtime of a node on one Redis server (the runtimes of a
//! partitioned queue, docs/design/partitions.md): one `BZPOPMIN` names the markers
//! of the runtimes waiting for work, and a marker popped wakes the runtime it belongs to. Only
//! waiting runtimes' markers are named, so a busy node takes no wake-up meant for an idle one;
//! a marker popped for a runtime that stopped waiting meanwhile is put back. While some runtime
//! of the node is busy, or every run slot of the node is taken, the block lasts at most
//! [`SHORT_BLOCK`] (a runtime that starts waiting joins the next one); when all wait, the block
//! timeout. A runtime whose node has no free slot is not named: the wake-up is another node's. On a Redis Cluster each partition is
//! a slot of its own, and one command cannot name keys of two slots, so there each runtime
//! keeps its own blocking connection (partitions sit on distinct masters while there are
//! enough, so that is one per master).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardctl_common::conn::Endpoint;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The longest block while some runtime of the node is not waiting.
const SHORT_BLOCK: Duration = Duration::from_millis(100);

/// A runtime's markers, whether it waits now, and what wakes it.
pub(crate) struct Member {
    markers: Vec<String>,
    waiting: AtomicBool,
    wake: Notify,
    routing: Arc<Notify>,
    /// Whether it would claim if woken now (a free run slot on the node).
    can_claim: Box<dyn Fn() -> bool + Send + Sync>,
}

impl Member {
    /// Waits for work and could claim it.
    fn ready(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) && (self.can_claim)()
    }
}

impl Member {
    /// Waits until one of its markers is popped, `wait` passes, or `stop`.
    pub(crate) async fn wait(&self, waiter: &Waiter, wait: Duration, stop: &CancellationToken) {
        self.waiting.store(true, Ordering::SeqCst);
        waiter.changed.notify_one();
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => {}
        }
        self.waiting.store(false, Ordering::SeqCst);
    }
}

/// The node's waiter: runtimes join it, then [`Waiter::run`] blocks for those that wait.
#[derive(Default)]
pub(crate) struct Waiter {
    members: Mutex<Vec<Arc<Member>>>,
    /// A runtime started waiting.
    changed: Notify,
}

impl Waiter {
    /// Adds a runtime blocking on `markers`; `routing` is notified too when the member popped
    /// is `route`.
    pub(crate) fn join(
        &self,
        markers: Vec<String>,
        routing: Arc<Notify>,
        can_claim: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Arc<Member> {
        let m = Arc::new(Member { markers, waiting: AtomicBool::new(false), wake: Notify::new(), routing, can_claim });
        self.members.lock().unwrap().push(m.clone());
        m
    }

    /// Blocks for the waiting members until `stop`, waking the owner of each marker popped. A
    /// connection error is retried after a second (the runtimes meanwhile wake on their own
    /// timers: they wait at most the block timeout).
    pub(crate) async fn run(self: Arc<Self>, endpoint: Endpoint, block: Duration, stop: CancellationToken) {
        let mut con = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let (keys, all) = {
                let members = self.members.lock().unwrap();
                let waiting: Vec<&Arc<Member>> = members.iter().filter(|m| m.ready()).collect();
                let keys: Vec<String> = waiting.iter().flat_map(|m| m.markers.clone()).collect();
                (keys, waiting.len() == members.len())
            };
            if keys.is_empty() {
                // none waits, or none could claim: look again when one starts waiting, or soon
                // (a slot of the node frees without telling the waiter)
                tokio::select! {
                    _ = self.changed.notified() => continue,
                    _ = tokio::time::sleep(SHORT_BLOCK) => continue,
                    _ = stop.cancelled() => return,
                }
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
            let t = if all { block } else { block.min(SHORT_BLOCK) };
            let mut cmd = redis::cmd("BZPOPMIN");
            cmd.arg(&keys).arg(t.as_secs_f64().max(0.01));
            let popped: redis::RedisResult<Option<(String, String, f64)>> = tokio::select! {
                r = cmd.query_async(c) => r,
                _ = stop.cancelled() => return,
            };
            match popped {
                Ok(Some((key, member, score))) => {
                    let owner = self.members.lock().unwrap().iter().find(|m| m.markers.contains(&key)).cloned();
                    match owner {
                        Some(m) if m.ready() => {
                            m.wake.notify_one();
                            if member == "route" {
                                m.routing.notify_one();
                            }
                        }
                        // it stopped waiting, or its node's slots filled, meanwhile: the wake-up
                        // goes back for another node
                        _ => {
                            let r: redis::RedisResult<()> =
                                redis::cmd("ZADD").arg(&key).arg(score).arg(&member).query_async(c).await;
                            if let Err(e) = r {
                                tracing::warn!("putting a marker back: {e}");
                            }
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
