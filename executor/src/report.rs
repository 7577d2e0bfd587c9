//! The reporter: shard tasks put their outcomes in the outbox ([`crate::outbox`]); it records
//! them in batches (one script call for all completions and failures, one for releases), retries
//! while Redis is away, and only then forgets the shards (their locks are kept alive until
//! recorded). While other shards of this executor run, or the claim loop waits to claim (its
//! claim takes the completions with it, one call for both), an outcome waits up to
//! [`FLUSH_AFTER`] for more to join its batch (so that short shards cost a fraction of a call
//! each); otherwise, and at shutdown, it is recorded at once.
//!
//! When the queue's durability asks (docs/design/durability.md), a batch's recorded completions
//! go to the confirmer (`crate::confirmer`) and count only once confirmed: their shards stay
//! held (their locks renewed) until then.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use shardctl_common::failure::Failure;
use shardctl_common::scripts::{self, Claimed, Finished, FinishedAs, GiveBack};
use shardctl_common::ScriptCode;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::outcome::{Outcome, Report};
use crate::shared::Shared;
use crate::stats::Stats;

/// Most reports recorded by one call.
pub(crate) const MAX_BATCH: usize = 512;

/// Longest an outcome waits for others to join its batch.
pub const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// Records reports until `closing` is cancelled (every shard task has ended by then) and the
/// outbox is empty. Completions the queue's durability asks to confirm go to `confirm` (the
/// confirmer, `crate::confirmer`), held until then; the reporter goes on recording meanwhile.
pub(crate) async fn run(shared: Arc<Shared>, closing: CancellationToken, confirm: UnboundedSender<Vec<Report>>) {
    let outbox = &shared.outbox;
    loop {
        if outbox.len() == 0 {
            if closing.is_cancelled() {
                return;
            }
            tokio::select! {
                biased;
                _ = outbox.wake.notified() => {}
                _ = closing.cancelled() => {}
            }
            continue;
        }
        // more outcomes are coming while other shards run, or the claim loop is about to claim
        // and takes the completions with it: let them join, a few ms at most
        let deadline = tokio::time::Instant::now() + FLUSH_AFTER;
        while outbox.len() > 0
            && outbox.len() < MAX_BATCH
            && !closing.is_cancelled()
            && (shared.starts.own_outstanding() > 1 || shared.claims.parked.load(Ordering::SeqCst))
        {
            tokio::select! {
                biased;
                _ = outbox.wake.notified() => {}
                _ = tokio::time::sleep_until(deadline) => break,
                _ = closing.cancelled() => break,
            }
        }
        let batch = outbox.take(MAX_BATCH);
        if batch.is_empty() {
            continue;
        }
        let held = record(&shared, &batch, &closing).await;
        let (held, done): (Vec<_>, Vec<_>) = batch.into_iter().zip(held).partition(|(_, h)| *h);
        forget(&shared, done.into_iter().map(|(r, _)| r).collect());
        if !held.is_empty() {
            shared.confirming.fetch_add(held.len(), Ordering::SeqCst);
            if let Err(e) = confirm.send(held.into_iter().map(|(r, _)| r).collect()) {
                // the confirmer ended (it panicked): forget them rather than stall the claims
                tracing::error!("the confirmer is gone: {} completions forgotten unconfirmed", e.0.len());
                shared.confirming.fetch_sub(e.0.len(), Ordering::SeqCst);
                forget(&shared, e.0);
            }
        }
    }
}

/// The reports' shards leave `held` (those still held by the reported claim: a later claim of
/// the same ref may have replaced it).
pub(crate) fn forget(shared: &Shared, batch: Vec<Report>) {
    let mut held = shared.held.lock().unwrap();
    for r in batch {
        if held.get(&r.claim.shard_ref).is_some_and(|h| h.claim.token == r.claim.token) {
            held.remove(&r.claim.shard_ref);
        }
    }
    shared.publish_in_flight(held.len());
}

/// The completions and failures of `batch`, as the scripts take them, for counting (a failure's
/// delay is not needed there: 0).
pub(crate) fn outcomes(batch: &[Report]) -> Vec<Finished<'_>> {
    batch
        .iter()
        .filter_map(|r| {
            let outcome = match &r.outcome {
                Outcome::Completed(result) => FinishedAs::Completed(result),
                Outcome::Failed(e) => FinishedAs::Failed { delay_ms: 0, reason: &e.reason, failure: e.failure },
                _ => return None,
            };
            Some(Finished { claim: &r.claim, outcome, ran_ms: r.ran_ms })
        })
        .collect()
}

/// The completions of `batch` (every report in it a completion), as the scripts take them.
pub(crate) fn completions(batch: &[Report]) -> Vec<Finished<'_>> {
    batch
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Completed(result) => {
                Some(Finished { claim: &r.claim, outcome: FinishedAs::Completed(result), ran_ms: r.ran_ms })
            }
            _ => None,
        })
        .collect()
}

/// Records a batch; returns, per report, whether it is a completion that counted and that the
/// queue's durability asks to confirm before it is counted here and its shard forgotten (every
/// other outcome is counted already).
pub(crate) async fn record(shared: &Shared, batch: &[Report], closing: &CancellationToken) -> Vec<bool> {
    let reasons: Vec<String> = batch
        .iter()
        .map(|r| match &r.outcome {
            Outcome::Failed(e) => e.reason.clone(),
            _ => String::new(),
        })
        .collect();
    let mut finished = Vec::new();
    // per outcome in `finished`: whether a call carrying it may have reached Redis already, and
    // its report's place in `batch`
    let mut sent = Vec::new();
    let mut at = Vec::new();
    let (mut releases, mut unstarted, mut given_back): (Vec<&Claimed>, Vec<&Claimed>, Vec<&Claimed>) =
        (Vec::new(), Vec::new(), Vec::new());
    for (n, (r, reason)) in batch.iter().zip(&reasons).enumerate() {
        match &r.outcome {
            Outcome::Completed(result) => {
                finished.push(Finished { claim: &r.claim, outcome: FinishedAs::Completed(result), ran_ms: r.ran_ms });
                sent.push(r.sent);
                at.push(n);
            }
            Outcome::Failed(e) => {
                // a retry-after's own delay (Redis's clock adds it), else the task's backoff
                let delay_ms = match e.failure {
                    Failure::RetryAfter(d) => d.as_millis() as u64,
                    _ => retry_delay_ms(shared, &r.claim),
                };
                shared.metrics.attempt_failed(e.failure);
                finished.push(Finished {
                    claim: &r.claim,
                    outcome: FinishedAs::Failed { delay_ms, reason, failure: e.failure },
                    ran_ms: r.ran_ms,
                });
                sent.push(r.sent);
                at.push(n);
            }
            Outcome::Release => releases.push(&r.claim),
            Outcome::Unstarted => unstarted.push(&r.claim),
            Outcome::GiveBack => given_back.push(&r.claim),
            Outcome::Dropped => {}
        }
    }
    let mut failures = 0;
    let mut closing_since: Option<std::time::Instant> = None;
    let mut confirm = vec![false; batch.len()];
    loop {
        let mut con = shared.con.clone();
        let done = async {
            let f = scripts::finish(&mut con, &shared.keys, &shared.cfg.node_id, &finished).await?;
            let mut r = scripts::release(&mut con, &shared.keys, &releases).await?;
            r.extend(scripts::release_as(&mut con, &shared.keys, &unstarted, GiveBack::Unstarted).await?);
            r.extend(scripts::release_as(&mut con, &shared.keys, &given_back, GiveBack::Behind).await?);
            Ok::<_, shardctl_common::Error>((f, r))
        }
        .await;
        match done {
            Ok((mut f, r)) => {
                let sent: Vec<bool> = sent.iter().map(|s| *s || failures > 0).collect();
                lost_replies(shared, &finished, &mut f, &sent).await;
                // counted completions (and an aggregation failed for good: its handler must not
                // run again) wait for their confirmation when the queue's durability asks
                let waits = crate::durable::waits(shared).await;
                let (mut now, mut now_codes) = (Vec::new(), Vec::new());
                for ((fin, code), n) in finished.iter().zip(&f).zip(&at) {
                    let held = matches!(fin.outcome, FinishedAs::Completed(_)) || fin.claim.shard_ref.is_aggregate();
                    if waits && held && *code == Ok(1) {
                        confirm[*n] = true;
                    } else {
                        now.push(fin.clone());
                        now_codes.push(*code);
                    }
                }
                count(shared, &now, &now_codes);
                for c in r {
                    match c {
                        Ok(_) => {
                            Stats::add(&shared.stats.released, 1);
                            shared.metrics.released.increment(1);
                        }
                        Err(code) => {
                            Stats::add(&shared.stats.refused, 1);
                            if code.is_lock_lost() {
                                shared.metrics.locks_lost.increment(1);
                            }
                        }
                    }
                }
                return confirm;
            }
            Err(e) if e.is_script_error() => {
                // a script error repeats on every retry: retrying would wedge the reporter and
                // keep every later outcome held. Drop this batch; its shards leave `held`, so the
                // heartbeat's reconcile gives back those still in `active` to run again.
                Stats::add(&shared.stats.refused, batch.len() as u64);
                let refs: Vec<String> = batch.iter().take(5).map(|r| r.claim.shard_ref.to_string()).collect();
                tracing::error!("recording {} outcomes failed for good (first: {refs:?}): {e}", batch.len());
                shared.beat.reconcile.store(true, std::sync::atomic::Ordering::SeqCst);
                return confirm;
            }
            Err(e) => {
                // completions are idempotent: a retry after a lost reply is refused, not recounted
                Stats::add(&shared.stats.redis_errors, 1);
                shared.metrics.redis_error(&e);
                failures += 1;
                let d = shardctl_common::backoff::redis_retry(failures);
                tracing::warn!("recording {} outcomes failed (retry in {d:?}): {e}", batch.len());
                if closing.is_cancelled() {
                    // at shutdown, give up once the locks are gone anyway: the sweep recovers
                    // the shards and they run again (at-least-once), nothing is counted twice
                    let since = *closing_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > shared.cfg.lock_duration {
                        tracing::error!("giving up on {} outcomes: redis unreachable at shutdown", batch.len());
                        return confirm;
                    }
                }
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// An outcome sent again after a connection error finds its lock gone when the first call did
/// record it (the reply was lost). Where `sent[i]` and the code is "lock missing", a shard whose
/// state shows the outcome recorded, in the same incarnation of its task, is counted as the
/// first call's: a completion when the shard is terminal; a failure when it is terminal or its
/// failure count passed the claim's (failed for good if this was its last attempt, else
/// retried); a deferral when the ref waits in `delayed`. Its count in Redis was made once, by
/// that call or, should this executor's lock have expired meanwhile, by the executor that ran it
/// again; it is not reported as refused.
pub(crate) async fn lost_replies(
    shared: &Shared,
    finished: &[Finished<'_>],
    codes: &mut scripts::ItemCodes,
    sent: &[bool],
) {
    let mut con = shared.con.clone();
    for ((f, c), sent) in finished.iter().zip(codes.iter_mut()).zip(sent) {
        let r = &f.claim.shard_ref;
        if !matches!((&c, sent), (Err(ScriptCode::LockMissing), true)) {
            continue;
        }
        let shardctl_common::model::Job::Shard(i) = r.job else {
            // the aggregation job's outcome (a result, or a failure for good) is its task's end, in
            // the same incarnation: completed, or failed (shards failed, or the aggregation did)
            let read: redis::RedisResult<(Option<u64>, Option<String>)> = redis::pipe()
                .hget(shared.keys.task(&r.task), "seq")
                .hget(shared.keys.task(&r.task), "state")
                .query_async(&mut con)
                .await;
            if read.is_ok_and(|(seq, state)| {
                seq == Some(r.seq) && matches!(state.as_deref(), Some("completed" | "failed"))
            }) {
                *c = Ok(1);
            }
            continue;
        };
        type Read = (Option<u64>, u8, Option<u32>, Option<u32>, Option<f64>);
        let read: redis::RedisResult<Read> = redis::pipe()
            .hget(shared.keys.task(&r.task), "seq")
            .getbit(shared.keys.terminal(&r.task), i as usize)
            .hget(shared.keys.shards(&r.task), format!("{i}:fails"))
            .hget(shared.keys.task(&r.task), "attempts")
            .zscore(shared.keys.delayed(), r.to_string())
            .query_async(&mut con)
            .await;
        let Ok((Some(seq), terminal, fails, attempts, due)) = read else { continue };
        if seq != r.seq {
            continue;
        }
        let code = match &f.outcome {
            FinishedAs::Completed(_) if terminal == 1 => 1,
            // a deferral raises no count: the ref waiting in `delayed` is its record
            FinishedAs::Failed { failure: Failure::RetryAfter(_), .. } if due.is_some() && terminal == 0 => 2,
            FinishedAs::Failed { failure, .. } if terminal == 1 || fails.is_some_and(|n| n > f.claim.fails) => {
                // the last attempt (or a permanent failure) fails for good; any other is retried
                let last = f.claim.fails + 1 >= attempts.unwrap_or(1);
                if last || (terminal == 1 && matches!(failure, Failure::Permanent | Failure::FailTask)) {
                    1
                } else {
                    2
                }
            }
            _ => continue,
        };
        tracing::debug!(shard = %shared.shown(r), "outcome recorded by a call whose reply was lost");
        *c = Ok(code);
    }
}

pub(crate) fn count(shared: &Shared, finished: &[Finished<'_>], codes: &scripts::ItemCodes) {
    let s = &shared.stats;
    let m = &shared.metrics;
    for (f, c) in finished.iter().zip(codes) {
        let agg = f.claim.shard_ref.is_aggregate();
        match (&f.outcome, c) {
            (FinishedAs::Completed(_), Ok(1)) if agg => {
                Stats::add(&s.aggregated, 1);
                m.aggregations_completed.increment(1);
                shared.tasks.forget(&f.claim.shard_ref.task);
            }
            (FinishedAs::Completed(_), Ok(1)) => {
                Stats::add(&s.completed, 1);
                m.completed.increment(1);
                if f.claim.backup {
                    m.backups_won.increment(1);
                }
            }
            (FinishedAs::Failed { reason, delay_ms, .. }, Ok(2)) => {
                Stats::add(&s.retried, 1);
                m.retried.increment(1);
                tracing::info!(shard = %shared.shown(&f.claim.shard_ref), attempt = f.claim.attempt, retry_in_ms = delay_ms, "shard failed: {reason}");
            }
            (FinishedAs::Failed { reason, .. }, Ok(1)) => {
                tracing::warn!(shard = %shared.shown(&f.claim.shard_ref), attempt = f.claim.attempt, "failed for good: {reason}");
                Stats::add(&s.failed, 1);
                if agg {
                    m.aggregations_failed.increment(1);
                    shared.tasks.forget(&f.claim.shard_ref.task);
                } else {
                    m.failed(reason);
                }
            }
            (_, Ok(_)) => Stats::add(&s.duplicates, 1),
            (_, Err(ScriptCode::TaskMissing)) => shared.tasks.forget(&f.claim.shard_ref.task),
            (_, Err(code)) => {
                Stats::add(&s.refused, 1);
                if code.is_lock_lost() {
                    m.locks_lost.increment(1);
                }
                tracing::warn!(shard = %shared.shown(&f.claim.shard_ref), "outcome refused: {code}");
            }
        }
    }
}

fn retry_delay_ms(shared: &Shared, claim: &Claimed) -> u64 {
    let backoff = shared
        .tasks
        .cached(&claim.shard_ref.task, claim.shard_ref.seq, &claim.task_inc)
        .map(|m| m.backoff)
        .unwrap_or_default();
    backoff.delay(claim.fails + 1, shardctl_common::backoff::jitter01()).as_millis() as u64
}
