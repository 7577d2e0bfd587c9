//! Runs one claimed shard: finds its handler, runs it (panics caught, cancellation honoured),
//! checks the result, and hands the outcome to the reporter.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;
use shardctl_common::model::{Job, ShardRef};
use shardctl_common::scripts::Claimed;
use shardctl_common::split::shard_range;
use tokio_util::sync::CancellationToken;

use crate::handler::{panic_message, AggregateContext, BoxFuture, ShardContext, ShardError};
use crate::outcome::{Outcome, Report};
use crate::shared::Shared;
use crate::tasks::TaskMeta;

/// Runs one shard in its slot (freed, and the next shard started, when this ends).
pub(crate) async fn shard(shared: Arc<Shared>, claim: Claimed, cancel: CancellationToken, slot: crate::slots::Slot) {
    let mut unreported = Unreported { shared: &shared, claim: Some(claim), cancel: &cancel };
    // one line per shard at debug (`--log debug`): started, and ended with its time and outcome
    let debug = tracing::enabled!(tracing::Level::DEBUG);
    let started = debug.then(std::time::Instant::now);
    if debug {
        let c = unreported.claim.as_ref().expect("set above");
        tracing::debug!(shard = %shared.shown(&c.shard_ref), attempt = c.attempt, "shard started");
    }
    let (outcome, ran_ms) = run(&shared, unreported.claim.as_ref().expect("set above"), &cancel).await;
    let claim = unreported.claim.take().expect("set above");
    if let Some(t) = started {
        let how = match &outcome {
            Outcome::Completed(_) => "completed".to_owned(),
            Outcome::Failed(e) => format!("failed: {}", e.reason),
            other => format!("{other:?}"),
        };
        tracing::debug!(shard = %shared.shown(&claim.shard_ref), ms = t.elapsed().as_millis() as u64, "shard ended: {how}");
    }
    report(&shared, claim, outcome, ran_ms, &cancel);
    drop(slot);
}

/// A shard whose outcome is not reported yet. Should its task unwind (a panic that escaped the
/// handler's guard, e.g. in a destructor of the dropped handler future), the shard fails instead
/// of staying held, unreported, under a live lease.
struct Unreported<'a> {
    shared: &'a Shared,
    claim: Option<Claimed>,
    cancel: &'a CancellationToken,
}

impl Drop for Unreported<'_> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            let failed = Outcome::Failed(ShardError::new("the shard's task panicked"));
            report(self.shared, claim, failed, None, self.cancel);
        }
    }
}

/// A shard claimed ahead that waited for a slot until shutdown (or was lost meanwhile): given
/// back, no attempt used up.
pub(crate) fn unstarted(shared: &Shared, claim: Claimed, cancel: &CancellationToken) {
    report(shared, claim, Outcome::Unstarted, None, cancel);
}

/// A shard claimed ahead that the executor will not start soon: given back behind the
/// aggregation jobs and retries waiting, no attempt used up.
pub(crate) fn given_back(shared: &Shared, claim: Claimed, cancel: &CancellationToken) {
    report(shared, claim, Outcome::GiveBack, None, cancel);
}

/// Hands an outcome (of an attempt that ran `ran_ms`, if it ran) to the reporter, unless the
/// shard is no longer ours.
fn report(shared: &Shared, claim: Claimed, outcome: Outcome, ran_ms: Option<u64>, cancel: &CancellationToken) {
    // only our own claim's entry: a later claim of the same ref may have replaced it
    let lost = match shared.held.lock().unwrap().get_mut(&claim.shard_ref) {
        Some(h) if h.claim.token == claim.token => {
            h.reporting = true;
            h.lost
        }
        _ => true,
    };
    let outcome = if lost {
        // another claim owns the shard now: our result would be refused anyway
        Outcome::Dropped
    } else if matches!(outcome, Outcome::Failed(_)) && cancel.is_cancelled() && shared.aborting.load(Ordering::SeqCst) {
        // shutdown stopped it: not the shard's fault, so no attempt is used up
        Outcome::Release
    } else {
        outcome
    };
    shared.outbox.push(Report { claim, outcome, ran_ms, sent: false });
}

/// Runs the attempt: its outcome, and how long its handler ran (ms, this host's monotonic clock;
/// a shard's only: docs/design/dashboard.md, "Where time goes").
async fn run(shared: &Shared, claim: &Claimed, cancel: &CancellationToken) -> (Outcome, Option<u64>) {
    let r = &claim.shard_ref;
    let mut con = shared.con.clone();
    // the task may be cached; else one read, retried while Redis is away
    let meta = loop {
        match shared.tasks.get(&mut con, &shared.keys, &r.task, r.seq, &claim.task_inc).await {
            Ok(m) => break m,
            Err(e) => {
                tracing::warn!(shard = %shared.shown(r), "reading the task: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                    _ = cancel.cancelled() => return (Outcome::Failed(ShardError::new("cancelled")), None),
                }
            }
        }
    };
    let Some(meta) = meta else {
        // the task was removed, or the id dispatched again: the complete script refuses the
        // shard (TaskMissing) and lets it go
        return (Outcome::Completed(String::new()), None);
    };
    let (result, ran_ms) = match r.job {
        Job::Shard(index) => {
            let started = std::time::Instant::now();
            let out = run_handler(shared, claim, &meta, index, cancel).await;
            let took = started.elapsed();
            shared.metrics.run_seconds.record(took.as_secs_f64());
            shared.ahead.ran_for(&r.task, took);
            (out, Some(took.as_millis() as u64))
        }
        Job::Aggregate => (run_aggregator(shared, claim, r, cancel).await, None),
    };
    let outcome = match result {
        Ok(v) => match encode(&v, shared.cfg.max_result_bytes) {
            Ok(s) => Outcome::Completed(s),
            Err(e) => Outcome::Failed(e),
        },
        Err(e) => Outcome::Failed(e),
    };
    (outcome, ran_ms)
}

/// JSON text of a result; empty for `null` (nothing is stored for it).
fn encode(v: &Value, limit: usize) -> Result<String, ShardError> {
    if v.is_null() {
        return Ok(String::new());
    }
    let s = v.to_string();
    if s.len() > limit {
        return Err(ShardError::new(format!("result is {} bytes; the limit is {limit}", s.len())));
    }
    Ok(s)
}

async fn run_handler(
    shared: &Shared,
    claim: &Claimed,
    meta: &TaskMeta,
    index: u64,
    cancel: &CancellationToken,
) -> Result<Value, ShardError> {
    let info = &meta.info;
    let Some(handler) = shared.registry.handler_for(&info.kind) else {
        return Err(ShardError::new(format!("no handler for kind {} on node {}", info.kind, shared.node_id)));
    };
    // a share's shards are the task's base..base+total: the handler sees the task's index
    let (local, index, total) = (index, info.global_index(index), info.task_total());
    if local >= info.total || index >= total || info.items < total {
        return Err(ShardError::new(format!(
            "shard {index} is outside the task ({total} shards, {} items)",
            info.items
        )));
    }
    let key = if info.has_keys {
        let mut con = shared.con.clone();
        let k: Option<String> = redis::cmd("HGET")
            .arg(shared.keys.shard_keys(&info.task_id))
            // a share keeps its keys at its own indexes
            .arg(local)
            .query_async(&mut con)
            .await
            .map_err(|e| ShardError::new(format!("reading the shard key: {e}")))?;
        // a share recreated after its partition's master lost it (and its keys) has none: the
        // handler is not handed its index in place of its key
        k.ok_or_else(|| {
            ShardError::new(format!("the key of shard {index} is missing (lost with its partition's writes?)"))
        })?
    } else {
        index.to_string()
    };
    let ctx = ShardContext {
        task_id: info.task_id.clone(),
        kind: info.kind.clone(),
        index,
        total,
        range: shard_range(index, total, info.items),
        key,
        payload: meta.payload.clone(),
        attempt: claim.attempt,
        node_id: shared.node_id.clone(),
        cancel: cancel.clone(),
    };
    // called inside the spawned task: a handler that panics before returning its future fails
    // the attempt like any other panic instead of ending this task without a report
    let limit = (info.shard_timeout_ms > 0).then(|| std::time::Duration::from_millis(info.shard_timeout_ms));
    guarded(Box::pin(async move { handler.run(ctx).await }), cancel, limit).await
}

async fn run_aggregator(
    shared: &Shared,
    claim: &Claimed,
    r: &ShardRef,
    cancel: &CancellationToken,
) -> Result<Value, ShardError> {
    // the aggregator acts outside Redis: only on a claim that is durable (when the queue asks)
    crate::durable::aggregation_claim(shared, &claim.shard_ref, &claim.token, cancel).await?;
    let mut con = shared.con.clone();
    // fresh counts, not the cached ones
    shared.tasks.forget(&r.task);
    let meta = crate::tasks::load(&mut con, &shared.keys, &r.task)
        .await
        .map_err(|e| ShardError::new(format!("reading the task: {e}")))?
        .filter(|m| m.info.seq == r.seq)
        .ok_or_else(|| ShardError::new("task missing"))?;
    // its shares where the task was dispatched, read now (an executor started before the
    // queue's partitions changed reads them where they are)
    let (results, cancelled) = crate::aggregate::outcomes(&mut con, &shared.home, &meta.info, &claim.token)
        .await
        .map_err(|e| ShardError::new(format!("reading shard results: {e}")))?;
    let info = meta.info;
    let ctx = AggregateContext {
        task_id: info.task_id.clone(),
        kind: info.kind.clone(),
        total: info.total,
        items: info.items,
        done: info.done,
        failed: info.failed,
        payload: meta.payload.clone(),
        attempt: claim.attempt,
        node_id: shared.node_id.clone(),
        results: Arc::new(results),
        cancelled: Arc::new(cancelled),
        cancel: cancel.clone(),
    };
    let aggregator = shared.registry.aggregator_for(&info.kind);
    guarded(Box::pin(async move { aggregator.aggregate(ctx).await }), cancel, None).await
}

/// Runs a handler's future so that a panic becomes a failure and cancellation or the time limit
/// stops it (dropping it kills a child process). It runs in the shard's own task: a second task
/// per shard cost a spawn, a wake-up and a copy of the future (see docs/design/observability.md).
async fn guarded(
    fut: BoxFuture<Result<Value, ShardError>>,
    cancel: &CancellationToken,
    limit: Option<std::time::Duration>,
) -> Result<Value, ShardError> {
    let deadline = async {
        match limit {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = CatchUnwind(fut) => match r {
            Ok(r) => r,
            Err(p) => Err(ShardError::new(format!("handler panicked: {}", panic_message(&*p)))),
        },
        _ = cancel.cancelled() => Err(ShardError::new("cancelled")),
        _ = deadline => Err(ShardError::new(format!("timed out after {:?}", limit.unwrap_or_default()))),
    }
}

/// Polls a future, turning a panic in it into `Err` with the panic's payload.
struct CatchUnwind(BoxFuture<Result<Value, ShardError>>);

impl std::future::Future for CatchUnwind {
    type Output = Result<Result<Value, ShardError>, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let fut = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(r)) => std::task::Poll::Ready(Ok(r)),
            Err(p) => std::task::Poll::Ready(Err(p)),
        }
    }
}
