//! Retry delays, the one policy of the project: `fixed:D` waits exactly D before every retry,
//! `exponential:D` waits D·2^(n-1) before retry n (capped at [`MAX_DELAY`]), drawn from
//! [delay/2, delay] (jitter), so that processes that failed together do not retry together.
//! A task's shards retry by its own [`Backoff`]; a failed Redis call is retried after
//! [`redis_retry`]; [`jitter01`] is the one source of jitter.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::time::parse_duration;

/// The longest delay any backoff produces.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// How long to wait before retrying a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// The same delay before every retry.
    Fixed(Duration),
    /// The delay doubles with every failed attempt.
    Exponential(Duration),
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::Exponential(Duration::from_secs(1))
    }
}

impl Backoff {
    /// The delay before the retry that follows failure number `fails` (1 for the first failure):
    /// for `Fixed`, exactly its delay; for `Exponential`, with jitter from `rand01` in [0, 1), in
    /// [d/2, d] of the nominal delay d.
    pub fn delay(&self, fails: u32, rand01: f64) -> Duration {
        let nominal = match *self {
            Backoff::Fixed(d) => return d.min(MAX_DELAY),
            Backoff::Exponential(d) => {
                let shift = fails.saturating_sub(1).min(40);
                d.checked_mul(1u32 << shift.min(31)).unwrap_or(MAX_DELAY)
            }
        }
        .min(MAX_DELAY);
        let r = rand01.clamp(0.0, 1.0);
        nominal.mul_f64(0.5 + 0.5 * r).min(nominal)
    }
}

/// The pause before retrying a failed Redis call (a claim, a report, a lock attempt) after
/// `failures` failures in a row (1 for the first): 100 ms doubling, at most 5 s, jittered.
pub fn redis_retry(failures: u32) -> Duration {
    capped(Backoff::Exponential(Duration::from_millis(100)), failures, Duration::from_secs(5))
}

/// `backoff`'s delay after `failures` failures, jittered, at most `max`.
pub fn capped(backoff: Backoff, failures: u32, max: Duration) -> Duration {
    backoff.delay(failures.max(1), jitter01()).min(max)
}

/// A uniform number in [0, 1), for jitter. Its quality hardly matters, its independence across
/// processes does: each thread's generator (xorshift) is seeded from the OS's randomness (the
/// random keys of std's `RandomState`).
pub fn jitter01() -> f64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local!(static STATE: Cell<u64> = Cell::new(
        std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
    ));
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

impl FromStr for Backoff {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, d) = s
            .split_once(':')
            .ok_or_else(|| format!("invalid backoff '{s}': expected fixed:D or exponential:D (e.g. exponential:1s)"))?;
        let d = parse_duration(d)?;
        match kind {
            "fixed" => Ok(Backoff::Fixed(d)),
            "exponential" => Ok(Backoff::Exponential(d)),
            _ => Err(format!("invalid backoff '{s}': kind must be fixed or exponential")),
        }
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backoff::Fixed(d) => write!(f, "fixed:{}ms", d.as_millis()),
            Backoff::Exponential(d) => write!(f, "exponential:{}ms", d.as_millis()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_retries_double_to_five_seconds_and_jitter_stays_in_range() {
        for _ in 0..100 {
            let j = jitter01();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
        let first = redis_retry(1);
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
        let late = redis_retry(30);
        assert!(late >= Duration::from_millis(2500) && late <= Duration::from_secs(5), "{late:?}");
    }

    #[test]
    fn parses_and_round_trips() {
        let b: Backoff = "exponential:500ms".parse().unwrap();
        assert_eq!(b, Backoff::Exponential(Duration::from_millis(500)));
        assert_eq!(b.to_string().parse::<Backoff>().unwrap(), b);
        assert_eq!("fixed:2s".parse::<Backoff>().unwrap(), Backoff::Fixed(Duration::from_secs(2)));
        assert!("linear:1s".parse::<Backoff>().unwrap_err().contains("fixed or exponential"));
        assert!("1s".parse::<Backoff>().is_err());
        assert!("fixed:abc".parse::<Backoff>().is_err());
    }

    #[test]
    fn delays_stay_within_jitter_bounds() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..10_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let base = Duration::from_millis(s % 10_000 + 1);
            let fails = (s >> 20) as u32 % 64 + 1;
            let r = (s >> 11) as f64 / (1u64 << 53) as f64;
            let fixed = Backoff::Fixed(base).delay(fails, r);
            assert_eq!(fixed, base, "fixed means fixed");
            let nominal = base.checked_mul(1 << (fails - 1).min(31)).unwrap_or(MAX_DELAY).min(MAX_DELAY);
            let exp = Backoff::Exponential(base).delay(fails, r);
            assert!(exp >= nominal / 2 && exp <= nominal, "{exp:?} of {nominal:?} at {fails}");
        }
    }

    #[test]
    fn exponential_doubles() {
        let b = Backoff::Exponential(Duration::from_millis(100));
        // jitter at its top (rand close to 1) gives the nominal delay
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(2, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(4, 1.0), Duration::from_millis(800));
        assert_eq!(b.delay(1000, 1.0), MAX_DELAY);
    }
}
