//! Reading executors' logs: colours stripped, counters summed, the stats logged at a graceful
//! stop.

pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sums `name=N` (sweep lines) or `name: N` (stats lines) over the lines containing `marker`.
pub(crate) fn sum_field(text: &str, marker: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            let at = l.find(&format!("{name}=")).map(|i| i + name.len() + 1).or_else(|| {
                let p = format!("{name}: ");
                l.find(&p).map(|i| i + p.len())
            })?;
            l[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse::<u64>().ok()
        })
        .sum()
}

/// The counters an executor logs when it stops gracefully.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ExecStats {
    pub(crate) claimed: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) retried: u64,
    pub(crate) released: u64,
    pub(crate) locks_lost: u64,
    pub(crate) duplicates: u64,
    pub(crate) aggregated: u64,
}

impl ExecStats {
    pub(crate) fn parse(log: &str) -> Option<Self> {
        let line = log.lines().find(|l| l.contains("executor stopped"))?;
        let f = |name: &str| sum_field(line, "executor stopped", name);
        Some(ExecStats {
            claimed: f("claimed"),
            completed: f("completed"),
            failed: f("failed"),
            retried: f("retried"),
            released: f("released"),
            locks_lost: f("locks_lost"),
            duplicates: f("duplicates"),
            aggregated: f("aggregated"),
        })
    }

    /// Claims that ended without an outcome recorded by this executor: each claim whose lock
    /// was really lost is one of them (dropped, or its outcome refused).
    pub(crate) fn abandoned(&self) -> u64 {
        self.claimed.saturating_sub(
            self.completed + self.failed + self.retried + self.released + self.duplicates + self.aggregated,
        )
    }
}
