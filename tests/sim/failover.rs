//! The rollback fault as a step (`rollback.rs`): the queue's one slot goes back 1 to
//! [`DEPTH`] steps, as a failover to a lagging replica does. What the model expects then:
//! - what lives in Redis is what it was at that instant, so the model of it is too: each
//!   snapshot carries the model's tasks, expired entries, `paused`, the last `seq` handed out,
//!   the executors' memberships and the `rebalancing` flag of the same instant, and the
//!   rollback puts them back. `meta.seq` goes back with it: an id dispatched again may get an
//!   incarnation number an executor saw before.
//! - what lives outside Redis stays: the dispatch nonces keep growing (a result still tells
//!   which dispatch made it), and every executor keeps what it holds, its claim tokens' seq
//!   (tokens are never reused) and its lost replies. Each sees the failover as a failed claim
//!   call (docs/design/identity.md): it compares every token at its next heartbeat, and half
//!   of them drop their task cache (the others keep it: its entries are checked by the full
//!   incarnation id the claim hands out, never by the ref's seq alone). Until then it may report shards Redis no longer knows or gives another
//!   token: the model predicts the refusal (-1, -2, -3) from the restored state like any other
//!   answer, so every invariant of `check.rs` still holds exactly after a rollback.

use super::executor::Member;
use super::model::TaskModel;
use super::rollback::Rollbacks;
use super::world::World;
use super::Outcome;

use std::collections::{BTreeMap, BTreeSet};

/// Snapshots kept: a rollback goes back 1 to `DEPTH` steps.
pub const DEPTH: usize = 6;

/// What the model knew of Redis at a snapshot.
#[derive(Clone)]
pub struct Saved {
    tasks: BTreeMap<String, TaskModel>,
    stale_entries: BTreeSet<String>,
    paused: bool,
    last_seq: u64,
    members: Vec<Member>,
    rebalancing: bool,
}

/// The ring of the queue's one slot.
pub fn rollbacks(prefix: &str) -> Rollbacks<Saved> {
    Rollbacks::new(vec![prefix.to_owned()], DEPTH)
}

impl World {
    /// Snapshots the slot with the model of this instant (after a step's check).
    pub async fn save(&mut self) -> Outcome {
        let saved = Saved {
            tasks: self.model.tasks.clone(),
            stale_entries: self.model.stale_entries.clone(),
            paused: self.model.paused,
            last_seq: self.model.last_seq,
            members: self.execs.iter().map(|e| e.member).collect(),
            rebalancing: self.rebalancing,
        };
        self.rb.snapshot(&mut self.con, vec![saved]).await?;
        if let Some(p) = &mut self.durable {
            p.saved(self.rb.newest(0));
        }
        Ok(())
    }

    /// The queue's slot fails over to a replica `1..=DEPTH` steps behind.
    pub async fn rollback(&mut self) -> Outcome {
        let n = match &self.durable {
            // a confirmation waited for a replica: the one promoted holds everything up to it
            Some(p) => self.rb.available_since(0, p.oldest()),
            None => self.rb.available(0),
        };
        if n == 0 {
            self.note("no snapshot to roll back to".into());
            return Ok(());
        }
        let back = self.rng.range(1, n as u64) as usize;
        let (s, (gone, restored)) = self.rb.restore(&mut self.con, 0, back).await?;
        self.note(format!("rollback: the queue's slot goes back {back} steps ({gone} keys out, {restored} back)"));
        self.model.tasks = s.tasks;
        self.model.stale_entries = s.stale_entries;
        self.model.paused = s.paused;
        self.model.last_seq = s.last_seq;
        self.rebalancing = s.rebalancing;
        for (ex, m) in self.execs.iter_mut().zip(s.members) {
            ex.member = m;
            // half of them see no failed call (their lease survived, nothing was in flight)
            // and keep their task cache: its entries are checked by the full incarnation id
            if self.rng.below(2) == 0 {
                ex.cache = Default::default();
            }
            ex.need_check = true;
        }
        Ok(())
    }
}
