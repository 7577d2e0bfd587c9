//! The outbox: outcomes of ended shards waiting to be recorded. Two take from it: the reporter
//! (after at most [`crate::report::FLUSH_AFTER`]), and the claim loop when nothing else runs:
//! its claim call then records the completions waiting (`complete.lua` and `claim.lua` as one
//! script call), so that when both are due one call does both. Each report is taken once.

use std::sync::Mutex;

use crate::outcome::{Outcome, Report};

#[derive(Default)]
pub(crate) struct Outbox {
    queue: Mutex<Vec<Report>>,
    /// Wakes the reporter: a report arrived, or the claim loop took some.
    pub(crate) wake: tokio::sync::Notify,
}

impl Outbox {
    pub(crate) fn push(&self, r: Report) {
        self.queue.lock().unwrap().push(r);
        self.wake.notify_one();
    }

    /// Gives reports back (a call that was to record them failed): the reporter retries them.
    pub(crate) fn put_back(&self, reports: Vec<Report>) {
        self.queue.lock().unwrap().extend(reports);
        self.wake.notify_one();
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.lock().unwrap().len()
    }

    /// Up to `max` reports, oldest first.
    pub(crate) fn take(&self, max: usize) -> Vec<Report> {
        let mut q = self.queue.lock().unwrap();
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Every report, if all are completions and at most `max` (else none: the reporter records
    /// them in one call anyway).
    pub(crate) fn take_completions(&self, max: usize) -> Vec<Report> {
        let taken = {
            let mut q = self.queue.lock().unwrap();
            if q.is_empty() || q.len() > max || q.iter().any(|r| !matches!(r.outcome, Outcome::Completed(_))) {
                return Vec::new();
            }
            std::mem::take(&mut *q)
        };
        // the reporter may be waiting to flush them: it looks again
        self.wake.notify_one();
        taken
    }
}
