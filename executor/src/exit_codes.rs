//! What an `--exec` handler's exit code means (`--exit-code CLASS=CODES`,
//! docs/design/failure-policies.md): by default the codes of sysexits.h that say so, 65
//! (`EX_DATAERR`) permanent, 75 (`EX_TEMPFAIL`) retry after 30 s, 78 (`EX_CONFIG`) fail the task;
//! any other non-zero code is a plain failure, retried after the task's backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use shardctl_common::failure::Failure;

/// How long an exit code of class `retry-after` defers the shard when its handler printed no
/// `{"retry_after_ms": N}` on stdout.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The classes `--exit-code` names, as spelled there.
const CLASSES: [&str; 4] = ["retry", "permanent", "retry-after", "fail-task"];

/// The failure class of each exit code that has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitCodes(BTreeMap<i32, &'static str>);

impl Default for ExitCodes {
    fn default() -> Self {
        ExitCodes(BTreeMap::from([(65, "permanent"), (75, "retry-after"), (78, "fail-task")]))
    }
}

impl ExitCodes {
    /// The defaults changed by `specs`, each `CLASS=CODE[,CODE...]` (`retry=65` makes 65 a plain
    /// failure again; a later spec wins for a code it names again).
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        let mut codes = ExitCodes::default();
        for spec in specs {
            let (class, list) = spec
                .split_once('=')
                .ok_or_else(|| format!("'{spec}' is not CLASS=CODES (for example permanent=65,2)"))?;
            let class = CLASSES
                .iter()
                .find(|c| **c == class.trim())
                .ok_or_else(|| format!("'{class}' is not a failure class; the classes are {}", CLASSES.join(", ")))?;
            for code in list.split(',') {
                let n: i32 = code
                    .trim()
                    .parse()
                    .ok()
                    .filter(|n| (1..=255).contains(n))
                    .ok_or_else(|| format!("'{}' in '{spec}' is not an exit code from 1 to 255", code.trim()))?;
                codes.0.insert(n, class);
            }
        }
        Ok(codes)
    }

    /// What exit `code` means; `stdout` is what the handler printed (a retry-after's delay may
    /// be there, `{"retry_after_ms": N}`).
    pub fn failure(&self, code: Option<i32>, stdout: &[u8]) -> Failure {
        match code.and_then(|c| self.0.get(&c)).copied() {
            Some("permanent") => Failure::Permanent,
            Some("fail-task") => Failure::FailTask,
            Some("retry-after") => {
                let asked = serde_json::from_slice::<Value>(stdout)
                    .ok()
                    .and_then(|v| v.get("retry_after_ms").and_then(Value::as_u64));
                Failure::retry_after(asked.map_or(DEFAULT_RETRY_AFTER, Duration::from_millis))
            }
            _ => Failure::Retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_changes() {
        let d = ExitCodes::default();
        assert_eq!(d.failure(Some(65), b""), Failure::Permanent);
        assert_eq!(d.failure(Some(78), b""), Failure::FailTask);
        assert_eq!(d.failure(Some(75), b""), Failure::RetryAfter(DEFAULT_RETRY_AFTER));
        assert_eq!(
            d.failure(Some(75), br#"{"retry_after_ms":1200}"#),
            Failure::RetryAfter(Duration::from_millis(1200))
        );
        assert_eq!(d.failure(Some(1), b""), Failure::Retry);
        assert_eq!(d.failure(None, b""), Failure::Retry);
        let c = ExitCodes::parse(&["permanent=2, 3".into(), "retry=65".into()]).unwrap();
        assert_eq!(c.failure(Some(3), b""), Failure::Permanent);
        assert_eq!(c.failure(Some(65), b""), Failure::Retry);
        for (bad, says) in
            [("permanent", "CLASS=CODES"), ("later=3", "not a failure class"), ("permanent=0", "1 to 255")]
        {
            let e = ExitCodes::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
