//! How many shards to claim ahead of a free run slot, from what the executor observes.
//!
//! A claim call costs a round trip and a script call. For shards of a few µs, claiming only for
//! free slots means one call per shard or two; for shards of minutes, claiming ahead would hoard
//! work other executors could start. So the executor measures the rate it starts shards at when
//! every slot is busy (`concurrency / mean run time`) and holds ahead what it would start within
//! [`HOLD`] at that rate, and at least what it starts during two claim round trips, never more
//! than the `--prefetch` bound. Long shards get none (a claim only for a free slot), a million
//! 200-µs shards get hundreds per call, with the same command line.
//!
//! The means are exponentially weighted and kept in atomics: every shard updates one, racing
//! updates lose a sample, which does not matter for an estimate.
//!
//! Shards held ahead go to tasks whose own shards were measured short (a mean per task), none to
//! those measured long, and a task not measured yet gets some while fewer than `concurrency` of
//! its shards wait here unstarted: the claim shares slots fairly among tasks
//! (docs/design/fairness.md), and shards ahead of a slow task beside a fast one would be hours
//! of work held for the fast one's rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this much work (at the observed start rate) is held ahead of the free slots: what a
/// higher-priority task or another executor waits at worst for shards this one claimed ahead.
pub const HOLD: Duration = Duration::from_millis(20);

/// Running shards that have gone this long (and ten mean run times) without one ending are
/// slower than the mean says: the start rate is taken as one per this quiet time at most, so
/// that a slow task met after fast ones is not held ahead at the fast ones' rate.
pub const QUIET: Duration = Duration::from_millis(100);

/// Weight of a new sample in the means (1/8).
const WEIGHT: f64 = 0.125;

/// The observed means (nanoseconds, as f64 bits; 0 = no sample yet).
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    run_ns: AtomicU64,
    claim_ns: AtomicU64,
    /// Task id → what is known of its shards' speed here; at most [`TASKS`] tasks.
    per_task: Mutex<HashMap<String, Known>>,
}

/// A task's speed as known here, and when its last shard was claimed or ended.
#[derive(Debug, Clone, Copy)]
struct Known {
    speed: Speed,
    seen: Instant,
}

/// A task seen within this long is named to the claim script ([`Ahead::speeds`]).
const RECENT: Duration = Duration::from_secs(10);

/// Makes room for a new task in `m`: past [`TASKS`], those not seen for a minute go, and if
/// that is not enough, all (they are measured again from their next shards).
fn make_room(m: &mut HashMap<String, Known>) {
    if m.len() >= TASKS {
        m.retain(|_, k| k.seen.elapsed() < Duration::from_secs(60));
    }
    if m.len() >= TASKS {
        m.clear();
    }
}

/// What an executor knows of a task's speed.
#[derive(Debug, Clone, Copy)]
enum Speed {
    /// None ended yet: this many wait here, claimed and not started.
    Trying(usize),
    /// The mean run time of its shards (ns).
    Mean(f64),
}

/// Tasks whose means are kept: past this many the map starts over (a new task is measured
/// again from its first shards).
const TASKS: usize = 256;

/// Moves the mean kept in `cell` (ns, f64 bits; 0 = none yet) by an eighth of `sample`; racing
/// updates may lose a sample. Also the inline-CPU means of [`crate::handler`].
pub(crate) fn update(cell: &AtomicU64, sample: Duration) {
    let x = sample.as_nanos() as f64;
    let old = f64::from_bits(cell.load(Ordering::Relaxed));
    let new = if old == 0.0 { x } else { old + WEIGHT * (x - old) };
    cell.store(new.max(1.0).to_bits(), Ordering::Relaxed);
}

impl Ahead {
    /// One shard's handler took `d` (from its start, waits for a CPU included: the rate derived
    /// from it is what the executor achieves, not what the handler alone could).
    pub(crate) fn ran(&self, d: Duration) {
        update(&self.run_ns, d);
    }

    /// One shard of task `task` took `d` (as [`Ahead::ran`], which this also records).
    pub(crate) fn ran_for(&self, task: &str, d: Duration) {
        self.ran(d);
        let x = d.as_nanos() as f64;
        let now = Instant::now();
        let mut m = self.per_task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = m.get_mut(task) {
            k.seen = now;
            if let Speed::Mean(v) = &mut k.speed {
                *v += WEIGHT * (x - *v);
                return;
            }
            k.speed = Speed::Mean(x.max(1.0));
            return;
        }
        make_room(&mut m);
        m.insert(task.to_owned(), Known { speed: Speed::Mean(x.max(1.0)), seen: now });
    }

    /// Shards of tasks `tasks` (one entry per shard, in runs) were claimed: those of a task not
    /// measured yet wait untried. Returns whether any did (then [`Ahead::is_trying`] tells).
    pub(crate) fn tried<'a>(&self, tasks: impl Iterator<Item = &'a str>) -> bool {
        let now = Instant::now();
        let mut m = self.per_task.lock().unwrap_or_else(|e| e.into_inner());
        let mut last: Option<(&str, usize)> = None;
        let add = |m: &mut HashMap<String, Known>, t: &str, n: usize| match m.get_mut(t) {
            Some(k) => {
                k.seen = now;
                if let Speed::Trying(w) = &mut k.speed {
                    *w += n;
                }
            }
            None => {
                make_room(m);
                m.insert(t.to_owned(), Known { speed: Speed::Trying(n), seen: now });
            }
        };
        for t in tasks {
            match &mut last {
                Some((l, n)) if *l == t => *n += 1,
                _ => {
                    if let Some((l, n)) = last {
                        add(&mut m, l, n);
                    }
                    last = Some((t, 1));
                }
            }
        }
        if let Some((l, n)) = last {
            add(&mut m, l, n);
        }
        m.values().any(|k| matches!(k.speed, Speed::Trying(_)))
    }

    /// Whether task `task` is not measured yet.
    pub(crate) fn is_trying(&self, task: &str) -> bool {
        let m = self.per_task.lock().unwrap_or_else(|e| e.into_inner());
        matches!(m.get(task).map(|k| k.speed), Some(Speed::Trying(_)))
    }

    /// A shard of `task` that waited untried started, or was given back unstarted.
    pub(crate) fn started_trying(&self, task: &str) {
        let mut m = self.per_task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Known { speed: Speed::Trying(n), .. }) = m.get_mut(task) {
            *n = n.saturating_sub(1);
        }
    }

    /// What the claim script's `speeds` says (`lua/claim.lua`, ARGV[7]): the ids of the tasks
    /// whose own mean run time would have at least one shard held ahead of `concurrency` slots
    /// (see [`Ahead::target`]), `-id` for the others measured, and for those not measured of
    /// which `concurrency` or more wait here unstarted; a task not named may get `concurrency`
    /// ahead.
    pub(crate) fn speeds(&self, concurrency: usize) -> String {
        let claim = f64::from_bits(self.claim_ns.load(Ordering::Relaxed));
        let m = self.per_task.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (task, k) in m.iter().filter(|(_, k)| k.seen.elapsed() < RECENT) {
            let fast = match k.speed {
                Speed::Trying(n) if n < concurrency => continue,
                Speed::Trying(_) => false,
                // a shard longer than the hold is never held ahead: claiming it when a slot frees
                // costs the slot one round trip (~0.3 ms), under 2% of its run, and what the
                // executors hold ahead of their slots is what a newcomer waits behind
                Speed::Mean(run) if run > HOLD.as_nanos() as f64 => false,
                Speed::Mean(run) => {
                    let rate = concurrency as f64 / run;
                    let hold = rate * HOLD.as_nanos() as f64;
                    hold.max((rate * 2.0 * claim).min(hold * 4.0)) >= 1.0
                }
            };
            if !out.is_empty() {
                out.push(',');
            }
            if !fast {
                out.push('-');
            }
            out.push_str(task);
        }
        out
    }

    /// One claim call took `d`, round trip included.
    pub(crate) fn claimed(&self, d: Duration) {
        update(&self.claim_ns, d);
    }

    /// True when the running shards have gone quiet for long ([`QUIET`], and ten mean run times):
    /// they are slower than the mean says.
    pub(crate) fn is_quiet(&self, quiet: Option<Duration>) -> bool {
        let run = f64::from_bits(self.run_ns.load(Ordering::Relaxed));
        quiet.is_some_and(|q| q > QUIET && q.as_nanos() as f64 > 10.0 * run)
    }

    /// Shards to hold ahead of the `concurrency` running ones, at most `max`; `quiet` is how
    /// long the running shards have gone without one ending.
    pub(crate) fn target(&self, concurrency: usize, max: usize, quiet: Option<Duration>) -> usize {
        let run = f64::from_bits(self.run_ns.load(Ordering::Relaxed));
        if run == 0.0 || max == 0 {
            // nothing measured yet: claim for free slots only, the first shards tell the rest
            return 0;
        }
        let claim = f64::from_bits(self.claim_ns.load(Ordering::Relaxed));
        // shards started per ns with every slot busy
        let mut rate = concurrency as f64 / run;
        if let Some(q) = quiet.filter(|&q| self.is_quiet(Some(q))) {
            rate = rate.min(1.0 / q.as_nanos() as f64);
        }
        let hold = rate * HOLD.as_nanos() as f64;
        let cover = rate * 2.0 * claim;
        let want = hold.max(cover.min(hold * 4.0));
        // below one shard of work ahead, none: the claim for a free slot is cheap next to it
        if want < 1.0 {
            return 0;
        }
        (want.ceil() as usize).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ahead(run: Duration, claim: Duration) -> Ahead {
        let a = Ahead::default();
        a.ran(run);
        a.claimed(claim);
        a
    }

    #[test]
    fn long_shards_are_never_claimed_ahead_and_short_ones_up_to_the_bound() {
        let rtt = Duration::from_micros(300);
        // nothing measured
        assert_eq!(Ahead::default().target(16, 1024, None), 0);
        // ten-minute shards, one-second shards: none ahead
        assert_eq!(ahead(Duration::from_secs(600), rtt).target(16, 1024, None), 0);
        assert_eq!(ahead(Duration::from_secs(1), rtt).target(16, 1024, None), 0);
        // 10 ms shards on 16 slots: 1600/s, 32 in 20 ms
        assert_eq!(ahead(Duration::from_millis(10), rtt).target(16, 1024, None), 32);
        // 200-µs shards: 80,000/s, 1600 in 20 ms: the bound
        assert_eq!(ahead(Duration::from_micros(200), rtt).target(16, 1024, None), 1024);
        assert_eq!(ahead(Duration::from_micros(200), rtt).target(16, 100, None), 100);
        assert_eq!(ahead(Duration::from_micros(200), rtt).target(16, 0, None), 0);
    }

    #[test]
    fn a_slow_claim_round_trip_is_covered_up_to_four_holds() {
        // 1 ms shards on 4 slots: 4000/s; 80 in 20 ms; a 50 ms round trip would want 400
        assert_eq!(ahead(Duration::from_millis(1), Duration::from_millis(1)).target(4, 10_000, None), 80);
        assert_eq!(ahead(Duration::from_millis(1), Duration::from_millis(50)).target(4, 10_000, None), 320);
    }

    #[test]
    fn running_shards_quiet_for_long_are_taken_as_slow() {
        // 200-µs shards, but none has ended for 150 ms: they are not what the mean says
        let a = ahead(Duration::from_micros(200), Duration::from_micros(300));
        assert_eq!(a.target(16, 1024, Some(Duration::from_millis(5))), 1024, "a short pause is no sign");
        assert_eq!(a.target(16, 1024, Some(Duration::from_millis(150))), 0);
        // 50 ms shards quiet for 150 ms: within ten mean run times, no sign either
        let a = ahead(Duration::from_millis(50), Duration::from_micros(300));
        assert_eq!(a.target(16, 1024, Some(Duration::from_millis(150))), 7);
    }

    fn speeds(a: &Ahead, concurrency: usize) -> Vec<String> {
        let mut v: Vec<String> =
            a.speeds(concurrency).split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        v.sort();
        v
    }

    #[test]
    fn tasks_measured_short_are_claimed_ahead_long_ones_not_and_new_ones_tried() {
        let a = ahead(Duration::from_micros(200), Duration::from_micros(300));
        assert!(speeds(&a, 4).is_empty(), "nothing known per task");
        a.ran_for("tiny", Duration::from_micros(50));
        a.ran_for("long", Duration::from_millis(500));
        assert_eq!(speeds(&a, 4), ["-long", "tiny"]);
        // 5 ms shards on 16 slots: 3200/s, 64 in 20 ms: ahead; on 1 slot, 4: ahead
        a.ran_for("mid", Duration::from_millis(5));
        assert!(speeds(&a, 16).contains(&"mid".to_owned()));
        assert!(speeds(&a, 1).contains(&"mid".to_owned()));
        // 50 ms shards: longer than the hold, never ahead, whatever the slots
        a.ran_for("fifty", Duration::from_millis(50));
        assert!(speeds(&a, 64).contains(&"-fifty".to_owned()));
        // a new task: tried while fewer than the concurrency wait unstarted
        assert!(a.tried(["new", "new", "tiny", "new"].into_iter()));
        assert!(a.is_trying("new") && !a.is_trying("tiny"));
        assert!(!speeds(&a, 4).iter().any(|s| s.ends_with("new")));
        a.tried(["new"].into_iter());
        assert!(speeds(&a, 4).contains(&"-new".to_owned()));
        a.started_trying("new");
        assert!(!speeds(&a, 4).iter().any(|s| s.ends_with("new")));
        a.ran_for("new", Duration::from_micros(10));
        assert!(speeds(&a, 4).contains(&"new".to_owned()));
    }

    #[test]
    fn the_means_move_by_an_eighth_of_each_sample() {
        let a = ahead(Duration::from_millis(8), Duration::ZERO);
        a.ran(Duration::from_millis(16));
        assert_eq!(f64::from_bits(a.run_ns.load(Ordering::Relaxed)), 9e6);
    }
}
