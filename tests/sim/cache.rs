//! The simulated executor's task cache, with the rule of `executor/src/tasks.rs`: an entry is
//! per incarnation, compared by the full incarnation id the claim handed out with the shard
//! (`inc`, `<seq>.<nonce>`), not by the ref's seq, which a rollback of the slot may give to a
//! later dispatch. A shard of another incarnation than the cached one reloads the task; a task
//! gone, or holding another incarnation than the shard's, gives nothing. The simulator checks
//! that every shard runs with the spec of its own incarnation (issue 11, defect 1), also when
//! an executor kept its cache through a rollback (`failover.rs`).

use std::collections::HashMap;

use shardctl_common::conn::Conn;
use shardctl_common::Home;

/// What a shard is run with: the task as dispatched (its incarnation and its payload's nonce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The incarnation the spec was read from (`seq`).
    pub inc: u64,
    /// Its full incarnation id (`inc`).
    pub full: u64,
    /// The dispatch's nonce, from the payload `{"n":<nonce>}`.
    pub nonce: u64,
}

/// Task specs by task id.
#[derive(Default)]
pub struct SpecCache {
    map: HashMap<String, Spec>,
}

impl SpecCache {
    /// The spec to run a shard of incarnation `inc` of task `id` with, claimed with the task's
    /// full incarnation id `full` (the hash of its `inc`).
    pub async fn get(&mut self, con: &mut Conn, home: &Home, id: &str, inc: u64, full: u64) -> Option<Spec> {
        if let Some(s) = self.map.get(id) {
            if s.inc == inc && s.full == full {
                return Some(*s);
            }
        }
        let Some(loaded) = load(con, home, id).await else {
            self.map.remove(id);
            return None;
        };
        if loaded.inc != inc || loaded.full != full {
            self.map.remove(id);
            return None;
        }
        self.map.insert(id.to_owned(), loaded);
        Some(loaded)
    }
}

async fn load(con: &mut Conn, home: &Home, id: &str) -> Option<Spec> {
    let (seq, inc, payload): (Option<u64>, Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(home.task(id))
        .arg("seq")
        .arg("inc")
        .arg("payload")
        .query_async(con)
        .await
        .expect("read the spec");
    let nonce = payload?.trim_start_matches("{\"n\":").trim_end_matches('}').parse().expect("payload {\"n\":<nonce>}");
    Some(Spec { inc: seq?, full: full_id(&inc.unwrap_or_default()), nonce })
}

/// A full incarnation id as a number (its hash: `Spec` stays `Copy`).
pub fn full_id(inc: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    inc.hash(&mut h);
    h.finish()
}
