//! Balanced item ranges: shard `i` of `n` over `m` items covers `[start_i, end_i)`; lengths
//! differ by at most one and together the ranges are exactly `[0, m)`. Ranges are derived,
//! never stored, so a task of a million shards costs nothing to describe.

use std::ops::Range;

/// The item range of shard `index` of `shards` over `items` items.
///
/// The first `items % shards` shards take one item more than the rest.
pub fn shard_range(index: u64, shards: u64, items: u64) -> Range<u64> {
    assert!(shards > 0 && index < shards, "shard {index} of {shards}");
    let base = items / shards;
    let extra = items % shards;
    let start = index * base + index.min(extra);
    let len = base + u64::from(index < extra);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator: property tests without a dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn check(shards: u64, items: u64) {
        let mut next = 0;
        let (mut min, mut max) = (u64::MAX, 0);
        for i in 0..shards {
            let r = shard_range(i, shards, items);
            assert_eq!(r.start, next, "gap or overlap at shard {i} of {shards} over {items}");
            next = r.end;
            min = min.min(r.end - r.start);
            max = max.max(r.end - r.start);
        }
        assert_eq!(next, items, "ranges must end at {items}");
        assert!(max - min <= 1, "lengths {min}..{max} for {shards} over {items}");
    }

    #[test]
    fn ranges_cover_exactly_and_balance_for_random_sizes() {
        let mut s = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let shards = xorshift(&mut s) % 500 + 1;
            let items = shards + xorshift(&mut s) % 100_000;
            check(shards, items);
        }
    }

    #[test]
    fn edge_sizes() {
        check(1, 1);
        check(1, u64::MAX / 2);
        check(7, 7);
        check(1000, 10_000_000);
        check(3, 4);
        // huge counts must not overflow
        let r = shard_range(999_999, 1_000_000, u64::MAX / 4);
        assert_eq!(r.end, u64::MAX / 4);
    }
}
