//! Redis Cluster hash slots: which slot a key lives in (CRC16 of its hash tag, modulo 16384), as
//! the cluster computes it. Partitioned queues choose their tags by it.

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster computes it.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The cluster slot of `key`: only the part between the first `{` and the next `}` is hashed,
/// when that part is not empty.
pub fn key_slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &b[open + 1..];
        rest.iter().position(|&c| c == b'}').filter(|&len| len > 0).map(|len| &rest[..len])
    });
    crc16(tagged.unwrap_or(b)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_key_slot_match_redis_cluster() {
        // reference values from the Redis Cluster specification and CLUSTER KEYSLOT
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("bar"), 5061);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS, "empty tag hashes the whole key");
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"), "the tag ends at the first '}}'");
    }
}
