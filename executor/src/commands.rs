//! A registry for handlers that are commands (`shardctl executor --exec`, `--worker`,
//! `--aggregate-exec`, `--aggregate-worker`): the built-in kinds, and the commands for the
//! kinds that are not built in.

use std::sync::Arc;

use shardctl_common::kinds::Served;
use shardctl_common::{Error, Result};

use crate::child::{ExecAggregator, ExecCommand, ExecHandler};
use crate::exit_codes::ExitCodes;
use crate::worker::{self, WorkerAggregator, WorkerHandler};
use crate::Registry;

/// The commands that run what is not built in, each a command line split like a shell's
/// words (no shell runs it).
#[derive(Debug, Default, Clone)]
pub struct Commands {
    /// The kinds `exec` or `worker` runs (`--kinds`): none of them may be built in.
    pub kinds: Served,
    /// One process per shard (`--exec`).
    pub exec: Option<String>,
    /// One process per aggregation (`--aggregate-exec`).
    pub aggregate_exec: Option<String>,
    /// Long-lived worker processes (`--worker`).
    pub worker: Option<String>,
    /// Long-lived worker processes for aggregations (`--aggregate-worker`).
    pub aggregate_worker: Option<String>,
    /// How long a worker's request may run with no sign of life from it before the worker is
    /// replaced (`--worker-silence`; `None`: [`worker::DEFAULT_SILENCE`]; zero: never).
    pub worker_silence: Option<std::time::Duration>,
    /// What the exit codes of `exec` and `aggregate_exec` mean (`--exit-code`).
    pub exit_codes: ExitCodes,
}

impl Commands {
    /// The built-in kinds, plus the commands for everything else; each command is checked to be
    /// runnable now. `max_output`: the most bytes a command may write as its result.
    pub fn registry(&self, max_output: usize) -> Result<Registry> {
        let command = |flag: &str, line: &str| {
            ExecCommand::parse(line, max_output)
                .map(|c| c.with_exit_codes(self.exit_codes.clone()))
                .and_then(|c| c.check_runnable().map(|()| c))
                .map_err(|e| Error::invalid(format!("--{flag}: {e}")))
        };
        let silence = self.worker_silence.unwrap_or(worker::DEFAULT_SILENCE);
        let mut r = Registry::with_builtins();
        let runs_some = self.exec.is_some() || self.worker.is_some();
        if let (Some(k), true) = (self.kinds.kinds().unwrap_or_default().iter().find(|k| r.has_own(k)), runs_some) {
            return Err(Error::invalid(format!(
                "--kinds: '{k}' is a built-in kind; --exec and --worker run kinds that are not built in"
            )));
        }
        if let Some(line) = &self.exec {
            r.fallback(self.kinds.clone(), ExecHandler(Arc::new(command("exec", line)?)));
        }
        if let Some(line) = &self.worker {
            r.fallback(self.kinds.clone(), WorkerHandler(worker::pool(command("worker", line)?, silence)));
        }
        if let Some(line) = &self.aggregate_exec {
            r.fallback_aggregator(ExecAggregator(Arc::new(command("aggregate-exec", line)?)));
        }
        if let Some(line) = &self.aggregate_worker {
            r.fallback_aggregator(WorkerAggregator(worker::pool(command("aggregate-worker", line)?, silence)));
        }
        Ok(r)
    }
}
