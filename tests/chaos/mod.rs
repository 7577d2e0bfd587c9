//! The crash test's harness (tests/crash.rs has the rounds and the checks of the processes;
//! `task` the checks of each task).
//!
//! # Layout
//! - `fleet`: the server, the schedule's generator, the executor processes and their fleet.
//! - `monitor`: the writes of the scripts, seen on a MONITOR connection.
//! - `logs`: reading the executors' logs.
//! - `task`: one task of a round, dispatched, disrupted, waited for and checked.
//! - `failover`: a master killed mid-task and its replica's promotion; the home's event log.

pub(crate) mod failover;
pub(crate) mod fleet;
pub(crate) mod logs;
pub(crate) mod monitor;
pub(crate) mod task;

pub(crate) use failover::Master;
pub(crate) use fleet::*;
pub(crate) use logs::*;
pub(crate) use monitor::*;
pub(crate) use task::{run_task, secs, Plan};
