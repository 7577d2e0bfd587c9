//! `shardctl`: the command line. Splits a task into shards (`dispatch`), runs them (`executor`),
//! keeps the queue maintained, fires its cron schedules and exports its progress
//! (`coordinator`), controls tasks and queues (`cancel`, `retry`, `clean`, `limit`, `pause`,
//! `resume`, `schedule`), shows progress (`status`, `wait`, `watch`) and demonstrates it all on a
//! private Redis (`demo`).
//!
//! # Layout
//! The library half of the package (`src/lib.rs`: `shardctl::Node`, the metrics exporter, the
//! dashboard) and the `shardctl-bench` crate (`bench/`) are what this binary runs; here are
//! argument parsing and printing.
//! - `cli/mod.rs`: the argument model (clap derive; its doc comments are the `--help` text).
//! - `cli/dispatch.rs`, `cli/executor.rs`, `cli/coordinator.rs`, `cli/status.rs`, `cli/wait.rs`,
//!   `cli/watch.rs`, `cli/config.rs`, `cli/bench.rs`, `cli/demo.rs`, `cli/lock.rs`,
//!   `cli/pause.rs`, `cli/schedule.rs`: one file per command.
//! - `cli/control.rs`: `cancel`, `retry`, `clean` and `limit`.
//! - `cli/task_args.rs`: the options describing a task, shared by `dispatch` and `schedule add`.
//! - `cli/ring.rs`: `ring simulate`.
//! - `cli/bar.rs`: the progress bar.
//!
//! Exit codes: 0 success, 1 error, 2 bad usage, 3 the task ended with failed shards or a failed
//! aggregation, 4 the task was cancelled (`wait`), 128 + n a wait stopped by signal n.
//! `shardctl lock` passes its command's exit code through and has codes of its own for its own
//! outcomes. Every code is in `cli/exit.rs`.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::Cli::parse_with_env() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(cli::usage_exit_code(&e));
        }
    };
    if let Err(e) = cli::init_logging(&args) {
        eprintln!("error: {e}");
        return ExitCode::from(cli::exit::USAGE);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(cli::exit::ERROR);
        }
    };
    match rt.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::exit::describe(&e));
            ExitCode::from(cli::exit::exit_code(&e))
        }
    }
}
