//! A seeded protocol simulator (issue 11): simulated executors, dispatchers and operators take
//! random steps in a random interleaving against a real redis-server, through the typed wrappers
//! of `shardctl_common::scripts` and `control`, so the real Lua scripts run. After every step the
//! state in Redis is checked against a reference model (`model.rs`, `check.rs`); at the end every
//! executor drains the queue (`drain.rs`). A violation names its seed, its step and the steps
//! before it; `SHARDCTL_SIM_SEED=<n>` replays it.

/// Fails the step with a message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

pub mod cache;
mod check;
pub mod clock;
mod drain;
mod durable;
pub mod executor;
mod failover;
mod fairness;
pub mod model;
mod operators;
pub mod rng;
pub mod rollback;
mod routing;
mod run;
mod snapshot;
mod steps;
mod sweep;
mod world;

pub use run::run;

/// A step's verdict: `Err` is a violated invariant, in words.
pub type Outcome = Result<(), String>;
