//! A task's completions over time (docs/design/dashboard.md, "Where time goes"): the series
//! `lua/include/throughput.lua` keeps in its task hash (`tp<i>`: the shards completed in bucket i,
//! `[tp_t0 + i·tp_w, + tp_w)` ms by Redis's clock; at most 64 buckets, which double in width as
//! the task runs on), read back, summed over a task's shares.

use std::collections::HashMap;

use serde::Serialize;

/// Buckets a series keeps (as the script's `TP_BUCKETS`).
pub const BUCKETS: usize = 64;

/// Completions per bucket of time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Series {
    /// The start of bucket 0 (ms, Redis's clock).
    pub start_ms: u64,
    /// Each bucket's width (ms).
    pub width_ms: u64,
    /// Shards completed in each bucket, up to the last that has any.
    pub counts: Vec<u64>,
}

/// The task hash fields of a series, for an `HMGET`: `tp_t0`, `tp_w`, `tp0` to `tp63`.
pub fn fields() -> Vec<String> {
    ["tp_t0".to_owned(), "tp_w".to_owned()].into_iter().chain((0..BUCKETS).map(|i| format!("tp{i}"))).collect()
}

impl Series {
    /// Read from the values of an `HMGET` of [`fields`]; `None` before the first completion.
    pub fn from_values(values: &[Option<String>]) -> Option<Series> {
        let num = |i: usize| values.get(i).and_then(|v| v.as_deref()).and_then(|v| v.parse::<u64>().ok());
        let (start_ms, width_ms) = (num(0)?, num(1).filter(|&w| w > 0)?);
        let mut counts: Vec<u64> = (0..BUCKETS).map(|i| num(2 + i).unwrap_or(0)).collect();
        while counts.last() == Some(&0) {
            counts.pop();
        }
        Some(Series { start_ms, width_ms, counts })
    }

    /// Read from a task hash (`HGETALL`).
    pub fn from_hash(h: &HashMap<String, String>) -> Option<Series> {
        let values: Vec<Option<String>> = fields().iter().map(|f| h.get(f).cloned()).collect();
        Series::from_values(&values)
    }

    /// `self` and `other` (another share's) as one series: from the earlier start, in the wider
    /// buckets, doubled until the span of both fits in [`BUCKETS`] (shares that ran far apart, or
    /// a partition whose clock is off, still make at most 64 bars); each bucket counted in the
    /// one holding its start.
    pub fn merged(self, other: &Series) -> Series {
        let start_ms = self.start_ms.min(other.start_ms);
        let end = |s: &Series| s.start_ms.saturating_add((s.counts.len() as u64).saturating_mul(s.width_ms));
        let span = end(&self).max(end(other)).saturating_sub(start_ms);
        let mut width_ms = self.width_ms.max(other.width_ms).max(1);
        while span / width_ms >= BUCKETS as u64 && width_ms < u64::MAX / 2 {
            width_ms *= 2;
        }
        let mut counts = vec![0; BUCKETS];
        for s in [&self, other] {
            for (i, &c) in s.counts.iter().enumerate() {
                let at = (s.start_ms.saturating_add((i as u64).saturating_mul(s.width_ms)) - start_ms) / width_ms;
                counts[(at as usize).min(BUCKETS - 1)] += c;
            }
        }
        while counts.last() == Some(&0) {
            counts.pop();
        }
        Series { start_ms, width_ms, counts }
    }

    /// Shards counted in it.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_reads_back_and_shares_merge_into_the_wider_buckets() {
        let mut h = HashMap::new();
        h.insert("tp_t0".to_owned(), "10000".to_owned());
        h.insert("tp_w".to_owned(), "1000".to_owned());
        h.insert("tp0".to_owned(), "3".to_owned());
        h.insert("tp2".to_owned(), "5".to_owned());
        let a = Series::from_hash(&h).unwrap();
        assert_eq!(a, Series { start_ms: 10_000, width_ms: 1000, counts: vec![3, 0, 5] });
        assert_eq!(Series::from_hash(&HashMap::new()), None);
        let b = Series { start_ms: 9_000, width_ms: 2000, counts: vec![1, 1] };
        let m = a.clone().merged(&b);
        assert_eq!((m.start_ms, m.width_ms, m.total()), (9_000, 2000, 10));
        // a's 10 s and 12 s buckets fall in [9, 11) and [11, 13); b's in [9, 11) and [11, 13)
        assert_eq!(m.counts, vec![4, 6]);
        // a share that ran a day later (or a clock a year off): still at most 64 buckets
        for later in [86_400_000, 365 * 86_400_000] {
            let c = Series { start_ms: 10_000 + later, width_ms: 1000, counts: vec![7] };
            let m = a.clone().merged(&c);
            assert!(m.counts.len() <= BUCKETS && m.total() == 15, "{m:?}");
            assert_eq!((m.counts[0], *m.counts.last().unwrap()), (8, 7), "{m:?}");
        }
    }
}
