//! The crash test's harness (tests/crash.rs has the rounds and their checks).
//!
//! # Layout
//! - `fleet`: the server, the schedule's generator, the executor processes and their fleet.
//! - `monitor`: the writes of the scripts, seen on a MONITOR connection.
//! - `logs`: reading the executors' logs.

pub(crate) mod fleet;
pub(crate) mod logs;
pub(crate) mod monitor;

pub(crate) use fleet::*;
pub(crate) use logs::*;
pub(crate) use monitor::*;
