//! Rate limiters usable on their own, each one Lua script (so they hold across any number of
//! processes): a fixed window (at most N per aligned window), a sliding-window log (at most N in
//! ANY window of length D) and a token bucket (bursts up to a capacity, long-run rate bounded).
//! Each call answers granted or the exact wait before asking again. Time is the Redis server's
//! (`TIME` in the scripts), so processes with skewed clocks share one limit.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::scripts::scripts;

/// The answer of a limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead.
    Granted,
    /// Not now: ask again after this long.
    Wait(Duration),
}

impl Decision {
    fn from_reply(v: (i64, i64, u64)) -> Self {
        if v.0 == 1 {
            Decision::Granted
        } else {
            Decision::Wait(Duration::from_millis(v.1.max(1) as u64))
        }
    }
    /// True when granted.
    pub fn granted(self) -> bool {
        self == Decision::Granted
    }
}

/// Which limiter, with its limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limiter {
    /// At most `max` per aligned window of `per`.
    FixedWindow {
        /// Grants per window.
        max: u64,
        /// Window length.
        per: Duration,
    },
    /// At most `max` in any window of `per`.
    SlidingLog {
        /// Grants per window.
        max: u64,
        /// Window length.
        per: Duration,
    },
    /// A bucket of `capacity` tokens refilled at `rate` per second.
    TokenBucket {
        /// Most tokens at once (the burst).
        capacity: u64,
        /// Tokens added per second.
        rate: f64,
    },
}

impl Limiter {
    /// Checks the limits.
    pub fn validate(&self) -> Result<()> {
        let ok = match *self {
            Limiter::FixedWindow { max, per } | Limiter::SlidingLog { max, per } => max >= 1 && per.as_millis() >= 1,
            Limiter::TokenBucket { capacity, rate } => capacity >= 1 && rate.is_finite() && rate > 0.0,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!("invalid limiter {self:?}: limits must be positive")))
        }
    }

    /// Asks for one grant under `key` (a key of the caller's choosing; in a cluster, with a hash
    /// tag of its own). `id` must be unique per request (the sliding log records it).
    pub async fn acquire<C: ConnectionLike + Send>(&self, con: &mut C, key: &str, id: &str) -> Result<Decision> {
        Ok(self.acquire_timed(con, key, id).await?.0)
    }

    /// [`Limiter::acquire`], with the time it was decided at (the Redis server's, in ms).
    pub async fn acquire_timed<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        key: &str,
        id: &str,
    ) -> Result<(Decision, u64)> {
        self.validate()?;
        let v: (i64, i64, u64) = match *self {
            Limiter::FixedWindow { max, per } => {
                scripts().limit_fixed.key(key).arg(max).arg(per.as_millis() as u64).invoke_async(con).await?
            }
            Limiter::SlidingLog { max, per } => {
                scripts().limit_sliding.key(key).arg(max).arg(per.as_millis() as u64).arg(id).invoke_async(con).await?
            }
            Limiter::TokenBucket { capacity, rate } => {
                scripts().limit_bucket.key(key).arg(capacity).arg(rate).invoke_async(con).await?
            }
        };
        Ok((Decision::from_reply(v), v.2))
    }
}
