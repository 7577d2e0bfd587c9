//! A task's shard run times (docs/design/dashboard.md, "Where time goes"): the histogram
//! `lua/include/durations.lua` keeps in its task hash (`h<b>`: run times in bucket
//! b = ⌊log₁.₂₅(ms + 1)⌋ ([`bucket`]), `h_max`), read back as a count, percentiles and the
//! longest.

use std::collections::HashMap;

use serde::Serialize;

/// The ratio between bucket bounds (as `lua/include/durations.lua`'s `DUR_STEP`).
pub const STEP: f64 = 1.25;
/// Buckets there can be: run times up to 2^40 ms (the script's `DUR_MAX_MS`) fall in 0..=124.
pub const BUCKETS: u32 = 125;

/// Run times as counted, summed over a task's shares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Count per bucket, by bucket.
    pub buckets: Vec<(u32, u64)>,
    /// The longest (ms).
    pub max_ms: u64,
}

/// One bucket as shown: the run times from `from_ms` up to `to_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Its lower bound (ms, included).
    pub from_ms: u64,
    /// Its upper bound (ms, excluded).
    pub to_ms: u64,
    /// Shards whose run time fell in it.
    pub count: u64,
}

/// What `status` and the dashboard show of a task's run times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Shards timed (completed, with a run time).
    pub count: u64,
    /// The median and the 90th and 99th percentiles (ms): the geometric middle of the bucket
    /// holding that rank (within about 12%), never past the longest.
    pub p50_ms: u64,
    /// 90th percentile (ms).
    pub p90_ms: u64,
    /// 99th percentile (ms).
    pub p99_ms: u64,
    /// The longest (ms, exact).
    pub max_ms: u64,
    /// The non-empty buckets, shortest first.
    pub histogram: Vec<Bucket>,
}

/// The task hash fields of the histogram, for an `HMGET`: `h0` to `h124`, `h_max`.
pub fn fields() -> Vec<String> {
    (0..BUCKETS).map(|b| format!("h{b}")).chain(["h_max".to_owned()]).collect()
}

/// The bucket of run time `ms`: ⌊log₁.₂₅(ms + 1)⌋, at most 124 (about 35 years).
pub fn bucket(ms: u64) -> u8 {
    let b = ((ms as f64 + 1.0).ln() / STEP.ln()).floor();
    b.min(f64::from(BUCKETS - 1)) as u8
}

/// Bucket `b`'s bounds (ms): `[1.25^b - 1, 1.25^(b+1) - 1)`, rounded up.
pub fn bounds(b: u32) -> (u64, u64) {
    let at = |e: i32| (STEP.powi(e) - 1.0).ceil().max(0.0) as u64;
    (at(b as i32), at(b as i32 + 1))
}

impl Histogram {
    /// Read from a task hash (every field, `HGETALL`); malformed fields are left out.
    pub fn from_hash(h: &HashMap<String, String>) -> Self {
        let mut buckets: Vec<(u32, u64)> = h
            .iter()
            .filter_map(|(k, v)| {
                let b: u32 = k.strip_prefix('h')?.parse().ok()?;
                Some((b, v.parse().ok()?))
            })
            .filter(|&(b, n)| b < BUCKETS && n > 0)
            .collect();
        buckets.sort_unstable();
        let num = |f: &str| h.get(f).and_then(|v| v.parse().ok()).unwrap_or(0);
        Histogram { buckets, max_ms: num("h_max") }
    }

    /// Read from the values of an `HMGET` of [`fields`], in that order.
    pub fn from_values(values: &[Option<String>]) -> Self {
        let num = |i: usize| values.get(i).and_then(|v| v.as_deref()).and_then(|v| v.parse().ok()).unwrap_or(0);
        let buckets = (0..BUCKETS).map(|b| (b, num(b as usize))).filter(|&(_, n)| n > 0).collect();
        Histogram { buckets, max_ms: num(BUCKETS as usize) }
    }

    /// Adds `other`'s run times (another share's).
    pub fn add(&mut self, other: &Histogram) {
        let mut all: HashMap<u32, u64> = self.buckets.iter().copied().collect();
        for &(b, n) in &other.buckets {
            *all.entry(b).or_default() += n;
        }
        self.buckets = all.into_iter().collect();
        self.buckets.sort_unstable();
        self.max_ms = self.max_ms.max(other.max_ms);
    }

    /// Shards timed.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.1).sum()
    }

    /// The run time at rank `q` (0 to 1): the geometric middle of its bucket, at most the longest.
    fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for &(b, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                let middle = (STEP.powf(f64::from(b) + 0.5) - 1.0).round().max(0.0) as u64;
                return middle.min(self.max_ms);
            }
        }
        self.max_ms
    }

    /// The summary; `None` when no shard was timed.
    pub fn summary(&self) -> Option<Summary> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let histogram = self
            .buckets
            .iter()
            .map(|&(b, count)| {
                let (from_ms, to_ms) = bounds(b);
                Bucket { from_ms, to_ms, count }
            })
            .collect();
        Some(Summary {
            count,
            p50_ms: self.quantile(0.5),
            p90_ms: self.quantile(0.9),
            p99_ms: self.quantile(0.99),
            max_ms: self.max_ms,
            histogram,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_a_bucket_of_the_truth() {
        let times: Vec<u64> = (1..=1000).map(|i| i * 3).collect();
        let mut h: HashMap<String, String> = HashMap::new();
        for &t in &times {
            let n: u64 = h.get(&format!("h{}", bucket(t))).map_or(0, |v| v.parse().unwrap());
            h.insert(format!("h{}", bucket(t)), (n + 1).to_string());
        }
        h.insert("h_max".into(), "3000".into());
        let s = Histogram::from_hash(&h).summary().unwrap();
        assert_eq!((s.count, s.max_ms), (1000, 3000));
        for (got, truth) in [(s.p50_ms, 1500.0), (s.p90_ms, 2700.0), (s.p99_ms, 2970.0)] {
            let ratio = got as f64 / truth;
            assert!((0.88..=1.13).contains(&ratio), "{got} against {truth}");
        }
        assert_eq!(s.histogram.iter().map(|b| b.count).sum::<u64>(), 1000);
        for b in &s.histogram {
            assert!(b.from_ms < b.to_ms, "{b:?}");
        }
        // the bounds hold what the script puts in them
        for t in [0, 1, 2, 7, 100, 4_999, 86_400_000] {
            let (lo, hi) = bounds(u32::from(bucket(t)));
            assert!(lo <= t && t < hi, "{t} in [{lo}, {hi})");
        }
    }

    #[test]
    fn shares_add_up_and_nothing_timed_is_no_summary() {
        let mut a = Histogram::from_values(&[]);
        assert_eq!(a.summary(), None);
        let mut v: Vec<Option<String>> = vec![None; BUCKETS as usize + 1];
        v[10] = Some("4".into());
        v[BUCKETS as usize] = Some("12".into());
        a.add(&Histogram::from_values(&v));
        a.add(&Histogram::from_values(&v));
        assert_eq!((a.count(), a.max_ms), (8, 12));
        assert_eq!(fields().len(), BUCKETS as usize + 1);
        assert_eq!((bucket(0), bucket(1), bucket(u64::MAX)), (0, 3, 124));
    }
}
