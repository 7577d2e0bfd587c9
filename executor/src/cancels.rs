//! [`Cancels`]: the queue's cancellation count as the heartbeat knows it.

/// The queue's cancellation count (`meta.cancels`) as the heartbeat knows it.
///
/// A count that moved is first taken as unsettled: the next beat sends a value Redis never holds
/// (`<count>?`), so it compares every token again, and the count settles only after a beat that
/// compared the tokens with no claim in flight. A claim whose script ran before the cancellation
/// may not have put its shards in `held` when a beat read it: without the second comparison they
/// would run on, their handlers never stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cancels {
    /// The count last read; empty before the first beat.
    count: String,
    /// No beat needs to compare every token for it.
    settled: bool,
}

impl Default for Cancels {
    /// Before the first beat: whatever Redis holds differs, so the first beat compares.
    fn default() -> Self {
        Cancels { count: String::new(), settled: true }
    }
}

impl Cancels {
    /// What the next beat sends (`extend.lua` compares every token unless it equals the count).
    pub(crate) fn sent(&self) -> String {
        if self.settled {
            self.count.clone()
        } else {
            format!("{}?", self.count)
        }
    }

    /// Whether `now`, the count Redis holds, is not the one the last beat read.
    pub(crate) fn differs(&self, now: &str) -> bool {
        self.count != now
    }

    /// After a beat that sent [`Cancels::sent`] and read `seen`.
    pub(crate) fn after(&self, seen: String, claim_in_flight: bool) -> Cancels {
        let same = self.count == seen;
        Cancels { settled: same && (self.settled || !claim_in_flight), count: seen }
    }
}

#[cfg(test)]
mod tests {
    use super::Cancels;

    fn at(count: &str, settled: bool) -> Cancels {
        Cancels { count: count.into(), settled }
    }

    #[test]
    fn a_moved_cancellation_count_is_checked_twice_and_again_while_a_claim_is_in_flight() {
        // unchanged: nothing to check
        assert_eq!(at("3", true).after("3".into(), true), at("3", true));
        assert_eq!(at("3", true).sent(), "3");
        // moved (or the first beat): the next beat checks again, sending what Redis never holds
        assert_eq!(at("3", true).after("4".into(), false), at("4", false));
        assert_eq!(at("4", false).sent(), "4?");
        assert_eq!(Cancels::default().after("0".into(), false), at("0", false));
        // the second check: settled only with no claim in flight
        assert_eq!(at("4", false).after("4".into(), true), at("4", false));
        assert_eq!(at("4", false).after("4".into(), false), at("4", true));
        // moved again meanwhile
        assert_eq!(at("4", false).after("5".into(), false), at("5", false));
    }
}
