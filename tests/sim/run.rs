//! One seed's run: a fresh queue, `steps` random steps, then the drain. A violation comes back
//! as a [`Failure`] that says how to replay it.

use std::collections::BTreeMap;
use std::fmt;

use shardctl_common::conn::Conn;
use shardctl_common::Home;

use super::world::World;

/// A violated invariant.
pub struct Failure {
    pub seed: u64,
    /// The step it was found at (1-based; past `steps`: in the drain).
    pub step: u64,
    pub steps: u64,
    pub message: String,
    /// The last steps, oldest first.
    pub log: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = if self.step > self.steps { "in the drain".to_owned() } else { format!("at step {}", self.step) };
        writeln!(f, "simulator seed {} violated an invariant {when} of {}:", self.seed, self.steps)?;
        writeln!(f, "  {}", self.message)?;
        writeln!(f, "last steps:")?;
        for s in &self.log {
            writeln!(f, "  {s}")?;
        }
        write!(
            f,
            "replay: SHARDCTL_SIM_SEED={} SHARDCTL_SIM_STEPS={} cargo test --test simulator -- --nocapture",
            self.seed, self.steps
        )
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Runs seed `seed` for `steps` steps and drains; the steps taken, by kind. With `durable` the
/// queue is in `replica` durability (`durable.rs`).
pub async fn run(
    con: Conn,
    home: Home,
    seed: u64,
    steps: u64,
    durable: bool,
) -> Result<BTreeMap<String, u64>, Failure> {
    let mut w = World::new(con, home, seed, durable).await;
    let fail = |w: &World, step: u64, message: String| Failure {
        seed,
        step,
        steps,
        message,
        log: w.log.iter().cloned().collect(),
    };
    for step in 1..=steps {
        w.at = step;
        if let Err(m) = w.step().await {
            return Err(fail(&w, step, m));
        }
    }
    w.at = steps + 1;
    w.drain().await.map_err(|m| fail(&w, steps + 1, m))?;
    Ok(w.tally)
}
