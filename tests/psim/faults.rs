//! The rollback fault of the partition simulator (`sim/rollback.rs` holds the snapshots): ONE
//! slot, the home `{P:Q}` or one partition `{P:Q@p.s}`, goes back 1 to [`DEPTH`] steps, as an
//! asynchronous-replication failover of its master does, while the other slots keep theirs.
//!
//! What the simulator then expects, and why:
//! - Every single-slot invariant of `check` still holds exactly (a slot is restored whole, to
//!   a state it had): the home's counts are the sum of its `part:<p>` fields, a home past
//!   `running` has every non-empty share counted, a share's counts are its terminal bits, at
//!   most one aggregation job per incarnation.
//! - The cross-slot rule "a counted share of this incarnation has ended with the counts
//!   counted" is waived for the shares whose slot or whose home rolled back, as for a share
//!   that lost its last completion (`lose`): those of every task with a home record at the
//!   rollback, named by the home record's dispatch (its payload's nonce, never reused, unlike
//!   `seq`). The home's count of such a share may be stale until the aggregation's check
//!   forgets it (`uncount.lua`) and the share is counted anew, or the reconciliation repairs
//!   it. A new dispatch of the id is checked in full again.
//! - Never waived: a share taken as this incarnation's (`home_inc` = the home's `inc`) is of
//!   the home's dispatch (the same payload), and every result it holds was made by an executor
//!   running that dispatch's spec. So a home that loses a dispatch and hands its `seq` to the
//!   next one, whose dispatcher adopts the old shares, is a violation.
//! - Aggregations recorded are part of the home's state: a home rollback restores the record
//!   of them its snapshot saw (an aggregation lost with the home is run again, and counts once).
//! - Executors keep what they hold (their tokens are never reused): whatever a rolled-back slot
//!   now says of it, their reports are refused or accepted by the scripts, never predicted
//!   here; only the invariants judge.
//! - The drain lets time pass: every lease in every slot runs out (a restored lease of an
//!   instance gone since no longer holds its shards for a minute) and the home records'
//!   dispatch leases lapse (`dispatch_until`), so that the reconciliation recreates shares a
//!   partition's rollback lost. Then every task not cancelled must end.

use std::collections::HashMap;

use super::rollback::Rollbacks;
use super::{Outcome, Sim, IDS, K};

/// Snapshots kept per slot.
pub const DEPTH: usize = 6;

/// Aggregations recorded (the home's payload; none for a partition).
pub type Recorded = Option<HashMap<(String, u64), u32>>;

/// The dispatch nonce of a payload `{"n":<nonce>}` (0: none).
pub fn nonce_of(payload: Option<&String>) -> u64 {
    payload.and_then(|p| p.trim_start_matches("{\"n\":").trim_end_matches('}').parse().ok()).unwrap_or(0)
}

/// The rings of the home (slot 0) and of each partition.
pub fn rollbacks(sim: &Sim) -> Rollbacks<Recorded> {
    let mut prefixes = vec![sim.layout.home.prefix().to_owned()];
    prefixes.extend(sim.layout.partitions.iter().map(|k| k.prefix().to_owned()));
    Rollbacks::new(prefixes, DEPTH)
}

impl Sim {
    /// Snapshots every slot (after a step's check).
    pub async fn save(&mut self) -> Outcome {
        let mut payloads = vec![Some(self.aggregated.clone())];
        payloads.extend((0..K).map(|_| None));
        let mut rb = self.rb.take().expect("rollbacks on");
        let r = rb.snapshot(&mut self.con, payloads).await;
        self.rb = Some(rb);
        r
    }

    /// The dispatch nonce of task `id`'s home record (0: none).
    pub async fn home_nonce(&mut self, id: &str) -> Result<u64, String> {
        let p: Option<String> = redis::cmd("HGET")
            .arg(self.layout.home.task(id))
            .arg("payload")
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        Ok(nonce_of(p.as_ref()))
    }

    /// Slot `s` (0: the home, p: partition p) fails over to a replica 1..=DEPTH steps behind.
    pub async fn rollback(&mut self, n: u64) -> Outcome {
        let s = self.rng.below(K as usize + 1);
        let avail = self.rb.as_ref().expect("rollbacks on").available(s);
        let steps = if avail == 0 { 0 } else { 1 + self.rng.below(avail) };
        self.roll_back(n, s, steps).await
    }

    /// Slot `s` (0: the home, p: partition p) goes back `steps` snapshots (one per step: 1 is
    /// the state before the last step), as far as there are.
    pub async fn roll_back(&mut self, n: u64, s: usize, steps: usize) -> Outcome {
        let mut rb = self.rb.take().expect("rollbacks on");
        let steps = steps.min(rb.available(s));
        let r = if steps == 0 { Ok(None) } else { rb.restore(&mut self.con, s, steps).await.map(Some) };
        self.rb = Some(rb);
        let Some((recorded, (gone, back))) = r? else { return Ok(()) };
        if let Some(rec) = recorded {
            self.aggregated = rec;
        }
        for i in 0..IDS {
            let id = format!("t{i}");
            let nonce = self.home_nonce(&id).await?;
            if nonce == 0 {
                continue;
            }
            let parts: Vec<u32> = if s == 0 { (1..=K).collect() } else { vec![s as u32] };
            for p in parts {
                self.lost.insert((id.clone(), p, nonce));
            }
        }
        let slot = if s == 0 { "the home".to_owned() } else { format!("partition {s}") };
        self.note(format!("#{n} rollback: {slot} goes back {steps} steps ({gone} keys out, {back} back)"));
        Ok(())
    }

    /// Time passes before the drain: every lease of every slot runs out, and every home
    /// record's dispatch lease lapses.
    pub async fn time_passes(&mut self) -> Outcome {
        let mut spaces = vec![self.layout.home.keys().clone()];
        spaces.extend(self.layout.partitions.iter().cloned());
        for k in &spaces {
            let holders: Vec<String> = redis::cmd("ZRANGE")
                .arg(k.leases())
                .arg(0)
                .arg(-1)
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            for h in holders {
                let () = redis::cmd("ZADD")
                    .arg(k.leases())
                    .arg("XX")
                    .arg(1)
                    .arg(&h)
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        // every dispatch lease lapses too (a dispatch cut short is over: its missing shares
        // are created again by the reconciliation)
        for i in 0..IDS {
            let key = self.layout.home.task(&format!("t{i}"));
            let held: bool = redis::cmd("HEXISTS")
                .arg(&key)
                .arg("dispatch_until")
                .query_async(&mut self.con)
                .await
                .map_err(|e| e.to_string())?;
            if held {
                let () = redis::cmd("HSET")
                    .arg(&key)
                    .arg("dispatch_until")
                    .arg(1)
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        self.note("time passes: every lease runs out, every dispatch lease".into());
        Ok(())
    }
}
