//! A queue's home: the keyspace under the queue's own hash tag `{P:Q}`, the truth of every
//! task record, of the queue's settings and of the partition layout (docs/design/partitions.md). A
//! partition's keyspace is a plain [`Keys`], made only from its
//! home ([`Home::partition`]); nothing turns a [`Keys`] into a [`Home`], so a function that takes
//! the home (a report, a reopen, the dispatch lease, a task's shares) cannot be handed a
//! partition.
//!
//! The home is a keyspace too (the one share of a task over one partition lives in it), so a
//! [`Home`] dereferences to its [`Keys`] wherever any keyspace will do.

use std::ops::Deref;

use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::names;

/// The home keyspace of one queue under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    keys: Keys,
}

impl Home {
    /// The home of queue `queue` under `prefix`; both must follow their rules in [`crate::names`]
    /// (`Error::Invalid` otherwise).
    pub fn new(prefix: &str, queue: &str) -> Result<Self> {
        Ok(Home { keys: Keys::new(prefix, queue)? })
    }

    /// The home's own keyspace.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The keys of one partition of this queue (docs/design/partitions.md): the
    /// same names under the partition's hash tag `tag` (stored in the home `meta`, made by
    /// [`crate::partition::tag`]). `Error::Invalid` for a tag that is not one of this queue's
    /// partitions: `<P>:<Q>@<p>.<salt>`.
    pub fn partition(&self, tag: &str) -> Result<Keys> {
        let (prefix, queue) = self.names();
        let ok = tag
            .strip_prefix(&format!("{prefix}:{queue}@"))
            .and_then(|r| r.split_once('.'))
            .is_some_and(|(p, s)| names::parse_number(p).is_some() && names::parse_number(s).is_some());
        if !ok {
            return Err(Error::invalid(format!("'{tag}' is not a partition tag of queue '{prefix}:{queue}'")));
        }
        Ok(Keys::with_tag(tag, queue))
    }

    /// The prefix and queue names the home was made of.
    pub fn names(&self) -> (&str, &str) {
        let tag = self.keys.tag();
        let queue = self.keys.queue();
        (&tag[..tag.len() - queue.len() - 1], queue)
    }
}

impl Deref for Home {
    type Target = Keys;

    fn deref(&self) -> &Keys {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_has_the_same_names_under_its_own_tag() {
        let home = Home::new("shardctl", "q").unwrap();
        assert_eq!(home.names(), ("shardctl", "q"));
        let p = home.partition("shardctl:q@2.17").unwrap();
        assert_eq!(p.lane_wait("k"), "{shardctl:q@2.17}:kind:k:wait");
        assert_eq!(p.queue(), "q");
        for bad in [
            "shardctl:q",
            "shardctl:q@2",
            "shardctl:qq@1.0",
            "other:q@1.0",
            "shardctl:q@x.0",
            "shardctl:q@1.0}",
            "shardctl:q@01.0",
            "shardctl:q@1.0.0",
        ] {
            assert!(home.partition(bad).is_err(), "{bad}");
        }
    }
}
