//! How a failed attempt is classified ([`Failure`]) and a task's failure limit ([`Threshold`]):
//! the rule is docs/design/failure-policies.md.

use std::time::Duration;

use crate::error::Error;

/// The longest a `retry_after` may defer a shard; longer asks are cut to it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Deferrals a shard may have before a `retry_after` counts as a plain failure (`lua/fail.lua`).
pub const MAX_DEFERRALS: u32 = 100;

/// What a failed attempt means for its shard and its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failure {
    /// Retried after the task's backoff until its attempts are used up.
    #[default]
    Retry,
    /// Fails for good now: no more attempts.
    Permanent,
    /// Not a failure: the next attempt not before this long from now (Redis's clock); the
    /// attempts left and the backoff stay as they were.
    RetryAfter(Duration),
    /// Fails for good now, and the whole task with it (as a fail-fast).
    FailTask,
}

impl Failure {
    /// Its letter in `lua/fail.lua`'s arguments.
    pub fn code(self) -> &'static str {
        match self {
            Failure::Retry => "r",
            Failure::Permanent => "p",
            Failure::RetryAfter(_) => "a",
            Failure::FailTask => "f",
        }
    }

    /// Its name in the worker protocol, the CLI and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Failure::Retry => "retry",
            Failure::Permanent => "permanent",
            Failure::RetryAfter(_) => "retry_after",
            Failure::FailTask => "fail_task",
        }
    }

    /// A `retry_after`'s delay, cut to [`MAX_RETRY_AFTER`].
    pub fn retry_after(d: Duration) -> Self {
        Failure::RetryAfter(d.min(MAX_RETRY_AFTER))
    }
}

/// A limit on a number of shards: a count, or a percentage of the task's shards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// This many shards.
    Count(u64),
    /// This percentage of the task's shards (0 to 100), rounded down.
    Percent(f64),
}

impl Threshold {
    /// The number of shards it stands for in a task of `total`, a percentage rounded down (a
    /// limit on failures: `--max-failures`).
    pub fn of(self, total: u64) -> u64 {
        match self {
            Threshold::Count(n) => n,
            Threshold::Percent(_) => u64::try_from(u128::from(total) * self.millis() / 100_000).unwrap_or(u64::MAX),
        }
    }

    /// A percentage in thousandths of a percent (exact integer arithmetic: 4.1% of 100,000 is
    /// 4,100, not the 4,099 a float product gives).
    fn millis(self) -> u128 {
        match self {
            Threshold::Count(_) => 0,
            Threshold::Percent(p) => (p * 1000.0).round() as u128,
        }
    }

    /// The number of shards it stands for in a task of `total`, a percentage rounded up (a goal:
    /// `--success-when 90%` of 15 shards is 14).
    pub fn at_least(self, total: u64) -> u64 {
        match self {
            Threshold::Count(n) => n,
            Threshold::Percent(_) => {
                u64::try_from((u128::from(total) * self.millis()).div_ceil(100_000)).unwrap_or(u64::MAX)
            }
        }
    }
}

impl std::str::FromStr for Threshold {
    type Err = Error;

    /// `N` or `N%` (`N` a number from 0 to 100, decimals allowed).
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::invalid(format!("'{s}' is not a number of shards (N) or a percentage of them (N%)"));
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(0.0..=100.0).contains(&p) {
                return Err(Error::invalid(format!("a percentage must be 0% to 100%, got {s}")));
            }
            Ok(Threshold::Percent(p))
        } else {
            s.trim().parse::<u64>().map(Threshold::Count).map_err(|_| bad())
        }
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Threshold::Count(n) => write!(f, "{n}"),
            Threshold::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_and_apply() {
        assert_eq!("10".parse::<Threshold>().unwrap(), Threshold::Count(10));
        assert_eq!("2.5%".parse::<Threshold>().unwrap().of(600), 15);
        assert_eq!("10%".parse::<Threshold>().unwrap().of(15), 1);
        assert_eq!("0".parse::<Threshold>().unwrap().of(600), 0);
        for bad in ["", "x", "-1", "101%", "%", "1.5"] {
            let e = bad.parse::<Threshold>().unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        assert_eq!(Threshold::Percent(10.0).to_string(), "10%");
        assert_eq!(Threshold::Percent(90.0).at_least(15), 14);
        assert_eq!("4.1%".parse::<Threshold>().unwrap().of(100_000), 4100);
        assert_eq!("100%".parse::<Threshold>().unwrap().at_least(1 << 32), 1 << 32);
        assert_eq!(Threshold::Count(7).at_least(15), 7);
    }

    #[test]
    fn retry_after_is_bounded() {
        assert_eq!(Failure::retry_after(Duration::from_secs(1 << 30)), Failure::RetryAfter(MAX_RETRY_AFTER));
        assert_eq!(Failure::Permanent.code(), "p");
    }
}
