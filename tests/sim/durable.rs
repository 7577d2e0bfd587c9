//! The rollback fault in `replica` durability (docs/design/durability.md): a process confirms
//! the slot (a `WAIT` a replica acknowledged) before it acts on a write a promise depends on,
//! so a failover can only lose what came after the last confirmation. The simulator confirms where the
//! product does: after a dispatch returned its id, after a claim handed out an aggregation job
//! (before the aggregator would start), after a completion's reply was seen (before the
//! executor forgets the shard), after the aggregation's result was recorded. A rollback then
//! goes back at most to the state after the last confirmation, and the invariant is checked after
//! every step: nothing waited for is lost. Every completion seen and confirmed is still there
//! (the shard terminal in the same dispatch, its result kept) while the model still holds that
//! dispatch, and every confirmed result is still the task's.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{State, TaskModel, Term};
use super::Outcome;

/// What a replica holds: the step of the last confirmation, and what was promised since the start.
#[derive(Default)]
pub struct Promises {
    /// The snapshot whose state the last confirmation made durable (`rollback.rs` serials).
    confirmed: u64,
    /// A confirmation during the step under way: the snapshot taken after it is durable.
    pending: bool,
    /// (task id, dispatch nonce) → shards whose completion was seen confirmed.
    completions: BTreeMap<(String, u64), BTreeSet<u64>>,
    /// (task id, dispatch nonce) → the state its aggregation's confirmed result ended it in.
    results: BTreeMap<(String, u64), State>,
}

impl Promises {
    /// A confirmation now: everything the slot holds is durable, so the snapshot taken after
    /// this step is the oldest a rollback may go back to.
    pub fn confirm(&mut self) {
        self.pending = true;
    }

    /// The snapshot `serial` was taken after this step: durable if the step confirmed.
    pub fn saved(&mut self, serial: u64) {
        if std::mem::take(&mut self.pending) {
            self.confirmed = serial;
        }
    }

    /// The snapshot a rollback may go back to, at the oldest.
    pub fn oldest(&self) -> u64 {
        self.confirmed
    }

    /// Shard `i` of the dispatch `nonce` of `id` was seen completed, and confirmed.
    pub fn completed(&mut self, id: &str, nonce: u64, i: u64) {
        self.confirm();
        self.completions.entry((id.to_owned(), nonce)).or_default().insert(i);
    }

    /// The aggregation of the dispatch `nonce` of `id` was seen completed, ending the task in
    /// `state`, and confirmed.
    pub fn result(&mut self, id: &str, nonce: u64, state: State) {
        self.confirm();
        self.results.insert((id.to_owned(), nonce), state);
    }

    /// An operator retried task `id`: the end its result was confirmed with may be reopened.
    pub fn reopened(&mut self, id: &str) {
        self.results.retain(|(t, _), _| t != id);
    }

    /// Nothing waited for is lost: every promise of a dispatch the model still holds is kept by
    /// the model (which `check.rs` holds equal to Redis).
    pub fn check(&self, tasks: &BTreeMap<String, TaskModel>) -> Outcome {
        for ((id, nonce), shards) in &self.completions {
            let Some(tm) = tasks.get(id).filter(|tm| tm.nonce == *nonce) else { continue };
            for &i in shards {
                ensure!(
                    tm.terminal.get(i as usize) == Some(&Some(Term::Done)),
                    "durable: shard {i} of {id} (dispatch {nonce}) was confirmed completed, now {:?}",
                    tm.terminal.get(i as usize)
                );
            }
        }
        for ((id, nonce), ended) in &self.results {
            let Some(tm) = tasks.get(id).filter(|tm| tm.nonce == *nonce) else { continue };
            ensure!(
                tm.state == *ended,
                "durable: {id} (dispatch {nonce}) had its result confirmed ({ended:?}), now {:?}",
                tm.state
            );
        }
        Ok(())
    }
}
