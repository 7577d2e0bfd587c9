//! The built-in kinds: `primes` (count primes in the shard's range on rayon; the aggregate is the
//! total), `noop` (benchmarks), `sleep` (`{"ms":N}`, chaos tests) and `fail` (`{"rate":R}`: fails
//! that fraction of attempts, deterministically by task, shard and attempt; `"class"` says what
//! its failures mean), plus the summary
//! aggregator used for kinds without one of their own.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::handler::{AggregateContext, Aggregator, BoxFuture, Failure, Handler, ShardContext, ShardError};

/// Counts the primes in `[start, end)` with a segmented sieve.
pub fn count_primes(start: u64, end: u64) -> u64 {
    if end <= 2 || start >= end {
        return 0;
    }
    let start = start.max(2);
    let limit = (end as f64).sqrt() as u64 + 1;
    // the sieving primes up to √end, kept per thread: a shard of a large task needs the same
    // table as the one before it, and building it costs as much as sieving a small shard
    BASE.with_borrow_mut(|base| {
        if base.limit < limit {
            *base = BasePrimes::up_to(limit.max(base.limit * 2));
        }
        sieve(start, end, &base.primes)
    })
}

/// The primes up to `limit`.
#[derive(Default)]
struct BasePrimes {
    limit: u64,
    primes: Vec<u64>,
}

impl BasePrimes {
    fn up_to(limit: u64) -> BasePrimes {
        let mut small = vec![true; limit as usize + 1];
        let mut primes = Vec::new();
        for i in 2..=limit as usize {
            if small[i] {
                primes.push(i as u64);
                let mut j = i * i;
                while j <= limit as usize {
                    small[j] = false;
                    j += i;
                }
            }
        }
        BasePrimes { limit, primes }
    }
}

thread_local!(static BASE: std::cell::RefCell<BasePrimes> = std::cell::RefCell::default());

/// Counts the primes in `[start, end)` (start ≥ 2) by a segmented sieve over `base` (every prime
/// up to √end at least; larger ones are skipped).
fn sieve(start: u64, end: u64, base: &[u64]) -> u64 {
    const SEGMENT: u64 = 1 << 18;
    let mut count = 0;
    let mut lo = start;
    // no larger than the range: a small shard allocates (and clears) only what it sieves
    let mut seg = vec![true; SEGMENT.min(end - start) as usize];
    while lo < end {
        let hi = (lo + SEGMENT).min(end);
        let len = (hi - lo) as usize;
        seg[..len].fill(true);
        for &p in base {
            if p * p >= hi {
                break;
            }
            let first = (lo.div_ceil(p) * p).max(p * p);
            let mut m = first;
            while m < hi {
                seg[(m - lo) as usize] = false;
                m += p;
            }
        }
        count += seg[..len].iter().filter(|&&b| b).count() as u64;
        lo = hi;
    }
    count
}

/// `primes`: counts the primes in the shard's items.
pub struct Primes;

impl Handler for Primes {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let r = ctx.range.clone();
            let n = ctx.cpu(move || count_primes(r.start, r.end)).await?;
            Ok(json!({ "primes": n }))
        })
    }
}

/// The `primes` aggregate: the sum of the shards' counts.
pub struct PrimesTotal;

impl Aggregator for PrimesTotal {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let mut total = 0u64;
            for o in ctx.results.iter() {
                if let Ok(v) = &o.result {
                    total += v.get("primes").and_then(Value::as_u64).ok_or_else(|| {
                        ShardError::new(format!("shard {} result has no \"primes\" count: {v}", o.index))
                    })?;
                }
            }
            Ok(json!({ "primes": total }))
        })
    }
}

/// Checks a task's payload for a built-in kind before anything is dispatched: `sleep` needs
/// `{"ms":N}`, `fail` `{"rate":R}` with R from 0 to 1. Other kinds' payloads are their
/// handlers' business.
pub fn check_payload(kind: &str, payload: &str) -> Result<(), String> {
    match kind {
        "sleep" => serde_json::from_str::<SleepPayload>(payload)
            .map(drop)
            .map_err(|e| format!("kind sleep needs a payload {{\"ms\":N}} (got {}): {e}", clip(payload))),
        "fail" => {
            let p = serde_json::from_str::<FailPayload>(payload)
                .map_err(|e| format!("kind fail needs a payload {{\"rate\":R}} (got {}): {e}", clip(payload)))?;
            if (0.0..=1.0).contains(&p.rate) {
                p.failure().map(drop)
            } else {
                Err(format!("kind fail needs a rate from 0 to 1, got {}", p.rate))
            }
        }
        _ => Ok(()),
    }
}

fn clip(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// `noop`: does nothing, at once.
pub struct Noop;

impl Handler for Noop {
    fn run(&self, _ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async { Ok(Value::Null) })
    }
}

/// `sleep`: waits `{"ms":N}`, stopping early when cancelled; on the node `"slow_node"` names,
/// `"slow_factor"` times longer (a straggling machine, for the bench and tests).
pub struct Sleep;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SleepPayload {
    ms: u64,
    slow_node: Option<String>,
    slow_factor: Option<u32>,
}

impl Handler for Sleep {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let p: SleepPayload = ctx.payload_as()?;
            let slow = p.slow_node.as_deref() == Some(&*ctx.node_id);
            let ms = if slow { p.ms.saturating_mul(u64::from(p.slow_factor.unwrap_or(100))) } else { p.ms };
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(ms)) => Ok(Value::Null),
                _ = ctx.cancel.cancelled() => Err(ShardError::new("cancelled")),
            }
        })
    }
}

/// `fail`: fails `{"rate":R}` of attempts, chosen by a hash of task, shard and attempt.
pub struct Fail;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailPayload {
    rate: f64,
    /// What the injected failures say (docs/design/failure-policies.md): `retry` (the default),
    /// `permanent`, `retry_after` (after `after_ms`, default 1000) or `fail_task`.
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    after_ms: Option<u64>,
    /// The same shards fail on every attempt (malformed input), not a fresh draw per attempt.
    #[serde(default)]
    sticky: bool,
}

impl FailPayload {
    /// The class of its injected failures; an error names the classes.
    fn failure(&self) -> Result<Failure, String> {
        let after = Duration::from_millis(self.after_ms.unwrap_or(1000));
        match self.class.as_deref().unwrap_or("retry") {
            "retry" => Ok(Failure::Retry),
            "permanent" => Ok(Failure::Permanent),
            "retry_after" => Ok(Failure::retry_after(after)),
            "fail_task" => Ok(Failure::FailTask),
            c => Err(format!("kind fail: class '{c}' is not one of retry, permanent, retry_after, fail_task")),
        }
    }
}

/// FNV-1a: a stable hash, the same on every node and every run.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether the `fail` kind fails this attempt at `rate`.
pub fn fails_at(task: &str, index: u64, attempt: u32, rate: f64) -> bool {
    let h = fnv1a(&[task.as_bytes(), &index.to_le_bytes(), &attempt.to_le_bytes()]);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < rate
}

impl Handler for Fail {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let p: FailPayload = ctx.payload_as()?;
            if !(0.0..=1.0).contains(&p.rate) {
                return Err(ShardError::new(format!(
                    "malformed payload for kind fail: rate {} is not in 0.0..=1.0",
                    p.rate
                )));
            }
            let drawn = if p.sticky { 0 } else { ctx.attempt };
            if fails_at(&ctx.task_id, ctx.index, drawn, p.rate) {
                let failure = p.failure().map_err(ShardError::new)?;
                let reason = format!("injected failure (rate {}, attempt {})", p.rate, ctx.attempt);
                return Err(ShardError { reason, failure });
            }
            Ok(Value::Null)
        })
    }
}

/// The aggregate of kinds without an aggregator: how many shards completed and failed.
pub struct Summary;

impl Aggregator for Summary {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move { Ok(json!({ "completed": ctx.done, "failed": ctx.failed })) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: u64, b: u64) -> u64 {
        (a..b).filter(|&n| n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| n % d != 0)).count() as u64
    }

    #[test]
    fn fail_payloads_name_their_class() {
        assert!(check_payload("fail", r#"{"rate":0.5,"class":"permanent"}"#).is_ok());
        assert!(check_payload("fail", r#"{"rate":1,"class":"retry_after","after_ms":5}"#).is_ok());
        let e = check_payload("fail", r#"{"rate":1,"class":"later"}"#).unwrap_err();
        assert!(e.contains("'later' is not one of"), "{e}");
        assert!(check_payload("fail", r#"{"rate":2,"class":"permanent"}"#).is_err());
    }

    #[test]
    fn primes_match_known_counts() {
        assert_eq!(count_primes(0, 10_000_000), 664_579);
        assert_eq!(count_primes(0, 100), 25);
        assert_eq!(count_primes(0, 2), 0);
        assert_eq!(count_primes(0, 3), 1);
    }

    #[test]
    fn primes_of_split_ranges_add_up() {
        for (a, b) in [(0, 1000), (1, 2), (2, 3), (97, 98), (1_000_000, 1_000_300), (999_983, 999_984)] {
            assert_eq!(count_primes(a, b), naive(a, b), "[{a}, {b})");
        }
        let shards = 37;
        let total: u64 = (0..shards)
            .map(|i| {
                let r = shardctl_common::split::shard_range(i, shards, 1_000_000);
                count_primes(r.start, r.end)
            })
            .sum();
        assert_eq!(total, 78_498);
    }

    #[test]
    fn fail_rate_is_deterministic_and_close() {
        let n = 20_000;
        let failed = (0..n).filter(|&i| fails_at("t", i, 1, 0.25)).count();
        assert!((4_500..5_500).contains(&failed), "{failed} of {n} at 0.25");
        assert_eq!(fails_at("t", 7, 1, 0.5), fails_at("t", 7, 1, 0.5));
        assert!((0..1000).all(|i| !fails_at("t", i, 1, 0.0)));
        assert!((0..1000).all(|i| fails_at("t", i, 1, 1.0)));
    }
}
