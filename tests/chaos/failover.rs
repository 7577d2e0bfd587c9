//! A master SIGKILLed mid-task on a cluster with replicas, and its replica's promotion followed
//! without stopping the schedule; and the home's event log, which tells what a failover of the
//! home's master left (the writes it had not replicated are gone, their events with them).
//!
//! Nothing waits for the replicas before the kill: losing the last writes is the fault to
//! survive, and to make sure it happens the replica is cut off from its master for 500 ms before
//! (frozen, its link closed). So the checks are what the protocol promises then: the lost work
//! runs again, and the surviving history counts every share once and records one result.

use std::time::{Duration, Instant};

use super::task::{progress, secs, share_progress, shares, Share};
use super::{Fleet, XorShift};
use crate::SHARDS;

/// Which master of a task is SIGKILLed mid-run; its replica is promoted (cluster-node-timeout
/// 2 s, so within a few seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Master {
    /// The master of one of the task's partitions, another than the home's: the share's claims
    /// and completions it had not replicated are lost, and run again.
    Partition,
    /// The master of the home's slot (the task record, the shares' counts, the aggregation
    /// job; on 4 partitions over 3 masters, a partition too): lost reports are repaired by the
    /// reconciliation.
    Home,
}

/// A master kill of one task: chosen, then struck once the task is under way, then followed
/// until the replica is promoted.
pub(crate) struct Kill {
    pub(crate) master: Master,
    slot: u16,
    /// The share whose progress times the kill (a partition's); `None`: the whole task's.
    share: Option<usize>,
    what: String,
    /// The port killed, and when.
    dead: Option<(u16, Instant)>,
    /// Shards done where the kill was timed, as the dying master had them.
    done_at_kill: u64,
    promoted: Option<u16>,
}

/// The kill is struck once this share of the work (percent) is done where it times it.
const KILL_AT_PERCENT: u64 = 15;
/// For this long before the kill, the dying master's replicas are cut off from it (frozen, their
/// links closed): the writes of that while are lost for sure, not only those of the last few
/// milliseconds a replica on this host lags by.
const REPLICAS_CUT: Duration = Duration::from_millis(500);

impl Kill {
    pub(crate) fn choose(c: &mut Fleet, master: Master, parts: &[Share], rng: &mut XorShift) -> Kill {
        let home = format!("{{shardctl:{}}}", c.queue);
        let cl = c.redis.cluster();
        let home_slot = cl.keyslot(&home);
        let home_owner = cl.owner(home_slot);
        match master {
            Master::Partition => {
                let others: Vec<usize> = (0..parts.len()).filter(|&i| cl.owner(parts[i].slot) != home_owner).collect();
                assert!(!others.is_empty(), "no partition on another master than the home's");
                let i = others[rng.below(others.len() as u64) as usize];
                let what = format!("partition {} (slot {})", parts[i].prefix, parts[i].slot);
                Kill { master, slot: parts[i].slot, share: Some(i), what, dead: None, done_at_kill: 0, promoted: None }
            }
            Master::Home => {
                let with: Vec<&str> =
                    parts.iter().filter(|s| cl.owner(s.slot) == home_owner).map(|s| s.prefix.as_str()).collect();
                let what = format!("the home {home} (slot {home_slot}; partitions there: {with:?})");
                Kill { master, slot: home_slot, share: None, what, dead: None, done_at_kill: 0, promoted: None }
            }
        }
    }

    /// Struck, its replica not yet promoted.
    pub(crate) fn down(&self) -> bool {
        self.dead.is_some() && self.promoted.is_none()
    }

    /// SIGKILLs the master once the work it times is under way (and not over).
    pub(crate) fn strike_when_due(
        &mut self,
        c: &mut Fleet,
        start: Instant,
        con: &mut redis::Connection,
        parts: &mut [Share],
        tkey: &str,
    ) {
        if self.dead.is_some() {
            return;
        }
        let task = tkey.rsplit_once(":task:").map(|(_, t)| t).expect("a task key");
        let done = match self.share {
            Some(i) => share_progress(&mut parts[i], task),
            None => progress(con, tkey, parts),
        };
        let Some((d, t)) = done else { return };
        if t == 0 || d * 100 < KILL_AT_PERCENT * t || d >= t {
            return;
        }
        let owner = c.redis.cluster().owner(self.slot);
        let replicas = c.redis.cluster().cut_off_replicas(owner);
        eprintln!("  +{:.1}s replicas {replicas:?} of :{owner} cut off ({d}/{t} shards done)", secs(start));
        c.pause(REPLICAS_CUT);
        // what the replicas lack: done since they were cut off
        let (d, t) = match self.share {
            Some(i) => share_progress(&mut parts[i], task),
            None => progress(con, tkey, parts),
        }
        .unwrap_or((d, t));
        let port = c.redis.cluster().kill_owner(self.slot);
        for r in replicas {
            c.redis.cluster().thaw(r);
        }
        self.dead = Some((port, Instant::now()));
        self.done_at_kill = d;
        eprintln!("  +{:.1}s SIGKILL master :{port} of {} ({d}/{t} shards done there)", secs(start), self.what);
    }

    /// Once the replica is promoted: the connections to the home and the shares renewed.
    pub(crate) fn follow(
        &mut self,
        c: &mut Fleet,
        start: Instant,
        con: &mut redis::Connection,
        parts: &mut Vec<Share>,
        tkey: &str,
    ) {
        let Some((_, at)) = self.dead.filter(|_| self.promoted.is_none()) else { return };
        let Some(owner) = c.redis.cluster().failed_over(self.slot) else { return };
        self.promoted = Some(owner);
        eprintln!(
            "  +{:.1}s replica :{owner} promoted, {:.1}s after the kill",
            secs(start),
            at.elapsed().as_secs_f64()
        );
        *con = c.redis.con(&c.queue);
        *parts = shares(c, con, tkey);
        let task = tkey.rsplit_once(":task:").map(|(_, t)| t).expect("a task key");
        let done = match self.share {
            Some(i) => share_progress(&mut parts[i], task),
            None => progress(con, tkey, parts),
        };
        if let Some((d, _)) = done {
            // (the live partitions went on meanwhile: only a partition's own count tells a loss)
            eprintln!("    done there now {d}, {} at the kill", self.done_at_kill);
        }
    }

    /// Strikes the kill if the schedule ended first (the task must still run), then waits for
    /// the promotion, the executors tended meanwhile.
    pub(crate) fn finish(
        &mut self,
        c: &mut Fleet,
        start: Instant,
        con: &mut redis::Connection,
        parts: &mut Vec<Share>,
        tkey: &str,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.dead.is_none() {
            c.pause(Duration::from_millis(50));
            let state: Option<String> = redis::cmd("HGET").arg(tkey).arg("state").query(con).unwrap();
            assert_eq!(state.as_deref(), Some("running"), "the task ended before its master was killed: raise ITEMS");
            self.strike_when_due(c, start, con, parts, tkey);
            assert!(Instant::now() < deadline, "the task never got under way");
        }
        while self.down() {
            c.pause(Duration::from_millis(100));
            self.follow(c, start, con, parts, tkey);
            assert!(Instant::now() < deadline, "no replica promoted in place of {}", self.what);
        }
    }
}

/// A task's entries in the home's event log: on the promoted replica, what survived.
#[derive(Debug, Default)]
pub(crate) struct Logged {
    /// `share_counted` less `share_uncounted`: the shards counted as done.
    pub(crate) counted: i64,
    pub(crate) shares_counted: u64,
    pub(crate) uncounted: u64,
    pub(crate) aggregating: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
}

impl Logged {
    pub(crate) fn read(con: &mut redis::Connection, prefix: &str, task: &str) -> Logged {
        let entries: Vec<(String, Vec<String>)> =
            redis::cmd("XRANGE").arg(format!("{prefix}events")).arg("-").arg("+").query(con).unwrap();
        let mut l = Logged::default();
        for (_, fields) in entries {
            let field = |name: &str| fields.chunks(2).find(|kv| kv[0] == name).map(|kv| kv[1].as_str());
            if field("task") != Some(task) {
                continue;
            }
            let done = || field("done").and_then(|d| d.parse::<i64>().ok()).unwrap_or(0);
            match field("event") {
                Some("share_counted") => {
                    l.counted += done();
                    l.shares_counted += 1;
                }
                Some("share_uncounted") => {
                    l.counted -= done();
                    l.uncounted += 1;
                }
                Some("task_aggregating") => l.aggregating += 1,
                Some("task_completed") => l.completed += 1,
                Some("task_failed") => l.failed += 1,
                _ => {}
            }
        }
        l
    }

    /// Every one of `shares` (if the task has any) counted once, and the task aggregated and
    /// finished once (an uncount withdraws the aggregation: triggered again).
    pub(crate) fn check(&self, shares: u64) {
        if shares > 0 {
            assert_eq!(self.counted, SHARDS as i64, "the counts logged in the home: {self:?}");
            assert_eq!(self.shares_counted - self.uncounted, shares, "each share counted once: {self:?}");
        }
        assert!((1..=1 + self.uncounted).contains(&self.aggregating), "aggregation triggered once: {self:?}");
        assert_eq!((self.completed, self.failed), (1, 0), "task finished once: {self:?}");
    }
}
