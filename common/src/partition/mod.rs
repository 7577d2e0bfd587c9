//! Partitions of a queue (docs/design/partitions.md): partition p (1 ≤ p ≤ K) of
//! queue Q under prefix P is the keyspace of the hash tag `P:Q@p.s`, `s` a salt chosen once so
//! that the partitions land on distinct masters of a cluster while there are enough. `@` cannot
//! occur in a queue or prefix name, so no partition's tag is another queue's.
//!
//! # Layout
//! - `layout`: [`Layout`], a queue's and a task's partitions, share ranges, tags.
//! - `placement`: choosing tags over a cluster's masters, setting the count, re-placing.
//! - `spread`: creating a task's shares at dispatch.
//!
//! Retrying a task over its partitions is in [`crate::retry`].

pub mod layout;
pub mod placement;
pub mod spread;

pub use layout::*;
pub use placement::*;
pub use spread::*;
