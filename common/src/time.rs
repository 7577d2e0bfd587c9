//! Time: the one clock of shared questions is the Redis server's (docs/design/clock.md);
//! the local clock only measures local waits and displays. Also duration parsing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;

/// Milliseconds since the Unix epoch by this host's clock: for local waits and displays only,
/// never compared with a time another process wrote.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `TIME` in a script whose one key is the queue's `meta`: it touches no key, the key only routes
/// the call to the queue's master on a cluster.
static SERVER_TIME: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    const TEXT: &str = "return redis.call('TIME')";
    let s = redis::Script::new(TEXT);
    crate::script_texts::register(s.get_hash(), TEXT);
    s
});

/// Milliseconds since the Unix epoch by the clock of the Redis server that holds queue `keys`
/// (`TIME` on its master, also on a cluster): what the scripts store and compare, so what a
/// process must use to judge a stored time (due fire times, ages of heartbeats).
pub async fn server_now_ms<C: ConnectionLike + Send>(con: &mut C, keys: &crate::Keys) -> crate::Result<u64> {
    let (s, us): (u64, u64) = SERVER_TIME.key(keys.meta()).invoke_async(con).await?;
    Ok(s * 1000 + us / 1000)
}

/// The longest duration a user may give (100 years): every time the scripts compute from one
/// (`TIME` + a delay, a retention, a lease) stays an exact integer of milliseconds in Lua's
/// doubles and within what `PEXPIRE` takes, so no script fails part-way on a number.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses a duration such as `500ms`, `5s`, `2m` or `1h 30m`; a bare number is seconds. Longer
/// than [`MAX_DURATION`] is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("invalid duration '{s}': {e} (examples: 500ms, 5s, 2m)"))?,
    };
    check_duration(s, d)
}

/// Refuses a duration longer than [`MAX_DURATION`], naming it as the user wrote it (`what`).
pub fn check_duration(what: &str, d: Duration) -> Result<Duration, String> {
    if d > MAX_DURATION {
        return Err(format!("duration '{what}' is too long: at most 100 years (36500d)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("soon").unwrap_err().contains("soon"));
        assert!(parse_duration("36500d").is_ok());
        assert!(parse_duration("300000000y").unwrap_err().contains("too long"), "the range is checked");
        assert!(parse_duration("99999999999999999").unwrap_err().contains("too long"));
    }
}
