//! `--worker` / `--aggregate-worker`: long-lived worker processes of any language that run one
//! shard (or aggregation) at a time over the line protocol of docs/handlers.md, version 1. A
//! Python worker pays its start once instead of once per shard.
//!
//! - `start`: a worker's start: spawn and hello.
//! - `process`: one worker: a request and its reply, cancel, death.
//! - `reply`: what a line of its stdout says (a reply, a sign of life, a late answer, wrong).
//! - `life`: the CPU time of its process group, a sign of life without a line.
//! - `lines`: its stdout read into lines, its stderr logged, a request's line.
//! - `pool`: the workers of one command, and the pauses of a command that keeps dying.

mod life;
mod lines;
mod pool;
mod process;
mod reply;
mod start;

use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::child::ExecCommand;
use crate::handler::{AggregateContext, Aggregator, BoxFuture, Handler, ShardContext, ShardError};

pub use lines::Request;
pub use pool::Pool;
pub use pool::{DEFAULT_SILENCE, FAILED_STARTS, MAX_PAUSE};
pub use process::{CANCEL_GRACE, PROTOCOL};
pub use start::HELLO_TIMEOUT;

/// Workers in a row that may exit before reading a request before the request fails.
const UNREAD_TRIES: u32 = 3;

/// The workers of `--worker CMD` (or `--aggregate-worker CMD`); see [`Pool::new`] for `silence`.
pub fn pool(cmd: ExecCommand, silence: std::time::Duration) -> Arc<Pool> {
    Arc::new(Pool::new(cmd, silence))
}

/// The lines that follow an aggregation's request, made anew for each worker it is sent to.
type Follow<'a> = &'a (dyn Fn() -> Box<dyn Iterator<Item = Map<String, Value>> + Send + 'a> + Sync);

/// `--worker`: runs each shard in one of the pool's workers.
pub struct WorkerHandler(pub Arc<Pool>);

impl Handler for WorkerHandler {
    fn paused(&self) -> bool {
        self.0.paused()
    }

    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        let pool = self.0.clone();
        Box::pin(async move {
            let request = shard_request(&ctx);
            let label = format!("{} shard {}", ctx.task_id, ctx.index);
            ask(&pool, &ctx.node_id, request, None, &label).await
        })
    }
}

/// `--aggregate-worker`: runs each aggregation in one of the pool's workers, the shards'
/// outcomes written to it line by line.
pub struct WorkerAggregator(pub Arc<Pool>);

impl Aggregator for WorkerAggregator {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        let pool = self.0.clone();
        Box::pin(async move {
            let mut request = Map::new();
            request.insert("type".into(), "aggregate".into());
            request.insert("task_id".into(), ctx.task_id.clone().into());
            request.insert("kind".into(), ctx.kind.clone().into());
            request.insert("total".into(), ctx.total.into());
            request.insert("done".into(), ctx.done.into());
            request.insert("failed".into(), ctx.failed.into());
            // k-of-n: the shards with no outcome line were cancelled
            request.insert("cancelled".into(), (ctx.cancelled.len() as u64).into());
            request.insert("attempt".into(), ctx.attempt.into());
            request.insert("payload".into(), payload(&ctx.payload));
            let request = Request::from_map(request);
            let results = ctx.results.clone();
            let outcomes = || -> Box<dyn Iterator<Item = Map<String, Value>> + Send + '_> {
                Box::new(results.iter().map(|o| {
                    let v = match &o.result {
                        Ok(r) => json!({ "type": "outcome", "shard": o.index, "result": r }),
                        Err(e) => json!({ "type": "outcome", "shard": o.index, "error": e }),
                    };
                    match v {
                        Value::Object(m) => m,
                        _ => unreachable!("an object"),
                    }
                }))
            };
            let label = format!("{} aggregation", ctx.task_id);
            ask(&pool, &ctx.node_id, request, Some(&outcomes), &label).await
        })
    }
}

/// One request through a worker of `pool`: a worker that answered in the protocol goes back to
/// the pool (or, if it said so, exits), any other is replaced. A worker that exited before it
/// read the request (one that recycles itself after answering) is replaced and the request
/// sent to the new one, up to [`UNREAD_TRIES`] workers, without failing the attempt. Dropped
/// while its request runs (the shard's timeout, a cancel, a lost lock: the runtime drops the
/// handler's future), the worker is sent a cancel and given [`CANCEL_GRACE`] by a task of its
/// own, then kept or killed.
async fn ask(
    pool: &Arc<Pool>,
    node_id: &str,
    request: Request,
    follow: Option<Follow<'_>>,
    label: &str,
) -> Result<Value, ShardError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut held = Held { worker: Some(pool.take(node_id).await?), pool: pool.clone() };
        let w = held.worker.as_mut().expect("taken");
        let mut lines = follow.map(|f| f());
        let r = w.ask(&request, lines.as_deref_mut().map(|l| l as _), label).await;
        let w = held.worker.take().expect("taken");
        return match r {
            Ok(v) if w.retiring() => {
                pool.let_go(w);
                Ok(v)
            }
            Ok(v) => {
                pool.give_back(w);
                Ok(v)
            }
            Err(f) if f.keep && w.retiring() => {
                pool.let_go(w);
                Err(ShardError { reason: f.reason, failure: f.class })
            }
            Err(f) if f.keep => {
                pool.give_back(w);
                Err(ShardError { reason: f.reason, failure: f.class })
            }
            Err(f) if f.unread && tries < UNREAD_TRIES => {
                pool.exited_unread(w, &f.reason);
                continue;
            }
            Err(f) if f.unread => {
                pool.exited_unread(w, &f.reason);
                Err(ShardError::new(format!(
                    "{UNREAD_TRIES} workers in a row exited before reading the request; the last: {}",
                    f.reason
                )))
            }
            Err(f) => {
                pool.died(w, &f.reason);
                Err(ShardError::new(f.reason))
            }
        };
    }
}

/// A worker taken for a request, until the request ends.
struct Held {
    worker: Option<process::Worker>,
    pool: Arc<Pool>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(mut w) = self.worker.take() else { return };
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(rt) if w.in_flight() => {
                let pool = self.pool.clone();
                rt.spawn(async move {
                    let f = w.cancel().await;
                    if f.keep && w.retiring() {
                        pool.let_go(w);
                    } else if f.keep {
                        pool.give_back(w);
                    } else {
                        pool.retire(w, "it did not answer a cancel within its grace");
                    }
                });
            }
            // cut while its request was being written: killed with its group
            _ => self.pool.retire(w, "its request was cut short"),
        }
    }
}

/// A shard's request, written straight into its line (no JSON tree per shard), the payload as
/// its own text when that is JSON on one line.
fn shard_request(ctx: &ShardContext) -> Request {
    let mut s = String::with_capacity(160 + ctx.payload.len() + ctx.key.len());
    let quoted = |s: &mut String, v: &str| s.push_str(&Value::from(v).to_string());
    s.push_str(r#"{"type":"shard","task_id":"#);
    quoted(&mut s, &ctx.task_id);
    s.push_str(r#","kind":"#);
    quoted(&mut s, &ctx.kind);
    let _ = write!(
        s,
        r#","index":{},"total":{},"start":{},"end":{},"key":"#,
        ctx.index, ctx.total, ctx.range.start, ctx.range.end
    );
    quoted(&mut s, &ctx.key);
    let _ = write!(s, r#","attempt":{},"payload":"#, ctx.attempt);
    let p = ctx.payload.trim();
    let raw = !p.is_empty() && !p.contains(['\n', '\r']) && serde_json::from_str::<serde::de::IgnoredAny>(p).is_ok();
    if raw {
        s.push_str(p);
    } else {
        s.push_str(&payload(&ctx.payload).to_string());
    }
    Request::from_open_object(s)
}

/// The task payload as JSON (`null` when none; text that is not JSON as a string).
fn payload(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}
