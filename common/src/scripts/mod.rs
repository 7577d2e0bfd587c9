//! The Lua scripts, one per atomic operation (`lua/`), held in one registry and called through
//! typed wrappers that know each script's KEYS and ARGV order. Scripts are called by SHA;
//! `redis::Script` loads one on the NOSCRIPT reply (after a restart or a `SCRIPT FLUSH`).
//!
//! # Layout
//! - `registry`: [`Lua`], the registry of every script ([`scripts`]), declared keys.
//! - `claimed`: [`Claimed`], a shard as its executor holds it.
//! - `claim`: claims (with completions riding on them) and the heartbeat.
//! - `finish`: completions, failures, give-backs.
//! - `task`: creating a task.
//! - `upkeep`: the stalled sweep, due retries, departed nodes, disowning, reading a lease.
//! - `nodes`: routed placement, moving lists, membership.
//! - `partition`: a partition's ended share counted in the home, and acknowledged; the home's
//!   decisions on limits over partitions, and a share stopped as it decided.
//! - `locks`: a token lock's release.
//! - `decode`: reply decoding.

mod claim;
mod claimed;
mod decode;
mod finish;
mod locks;
mod nodes;
mod partition;
mod registry;
mod task;
mod upkeep;

pub use claim::*;
pub use claimed::Claimed;
pub use decode::ItemCodes;
pub use finish::*;
pub use locks::*;
pub use nodes::*;
pub use partition::*;
pub use registry::*;
pub use task::*;
pub use upkeep::*;
