//! A simulated executor: its instance id (its lease is its entry in the `leases` zset), the seq of its next
//! claim token, the (ref, token) pairs it holds with the spec each runs with, its task cache,
//! and the `cancels` count it saw last.

use shardctl_common::kinds::Served;
use shardctl_common::scripts::Claimed;

use super::cache::{Spec, SpecCache};

/// A shard the executor believes it holds.
pub struct Held {
    pub claim: Claimed,
    /// What the shard runs with (from the cache, at claim time).
    pub spec: Spec,
    /// Its outcome was reported but the reply was lost: the executor will report it again.
    pub reported: bool,
}

/// An executor's membership, as `nodes` must hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    /// Not in `nodes` (never joined, left, or reaped).
    Out,
    /// Joined: its score is in the future.
    Live,
    /// Its membership ran out (score in the past), not reaped yet.
    Expired,
}

/// One executor.
pub struct Executor {
    pub instance: String,
    /// Its node id: numeric, so that `routed-nodes` is an intset and `SMEMBERS` (the order in
    /// which a rebalance fails departed nodes over) does not follow the server's hash seed.
    pub node: String,
    pub member: Member,
    /// The seq of the next claim token `<instance>:<seq>`.
    pub seq: u64,
    pub held: Vec<Held>,
    pub cache: SpecCache,
    /// The `cancels` count returned by its last heartbeat.
    pub cancels: String,
    /// A claim took its lapsed lease again: the next heartbeat compares every token.
    pub need_check: bool,
    /// The kinds it claims: executor 0 every kind (so that the drain ends), the others one
    /// kind, the other, or every kind.
    pub served: Served,
}

impl Executor {
    /// Executor number `n`.
    pub fn new(n: usize) -> Self {
        Executor {
            instance: format!("e{n}"),
            node: format!("{}", 10 + n),
            member: Member::Out,
            seq: 0,
            held: Vec::new(),
            cache: SpecCache::default(),
            cancels: "0".into(),
            need_check: false,
            served: match n % 3 {
                0 => Served::Every,
                k => Served::only([super::operators::KINDS[k - 1]]).expect("a kind"),
            },
        }
    }

    /// The seq of a new claim call.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The (ref, token) pairs it holds, in `held` order.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.held.iter().map(|h| (h.claim.shard_ref.to_string(), h.claim.token.clone())).collect()
    }
}

/// The instance of a token `<instance>:<seq>`.
pub fn instance_of(token: &str) -> &str {
    token.rsplit_once(':').map_or(token, |(i, _)| i)
}
