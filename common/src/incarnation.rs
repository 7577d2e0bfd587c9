//! What identifies one incarnation of a task across slots (docs/design/partitions.md): `inc` =
//! `<seq>.<nonce>`, the slot's submission counter beside 64
//! random bits the dispatcher draws, so that a slot rolled back by a failover (its `meta.seq`
//! handed out again) never reissues an incarnation; and the lease under which a dispatch over
//! partitions writes its shares.

use std::time::Duration;

/// 64 random bits in 16 hex digits, for the `nonce` field of a new task record. Drawn from
/// the OS's randomness (std's `RandomState` keys) mixed with the time and a process counter,
/// so two draws in one process never repeat.
pub fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{:016x}", h.finish())
}

/// How long a dispatch over partitions holds its task before the reconciliation may take a
/// missing share as lost; its dispatcher renews it after every share and every chunk of keys.
pub const DISPATCH_LEASE: Duration = Duration::from_secs(30);

/// The incarnation stored in a record's `inc` field, or its `seq` alone for a record written
/// before incarnations had a nonce.
pub fn of_fields(inc: Option<&str>, seq: Option<u64>) -> Option<String> {
    inc.map(str::to_owned).or_else(|| seq.map(|s| s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_do_not_repeat_and_are_hex() {
        let a: std::collections::HashSet<String> = (0..10_000).map(|_| nonce()).collect();
        assert_eq!(a.len(), 10_000);
        assert!(a.iter().all(|n| n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
