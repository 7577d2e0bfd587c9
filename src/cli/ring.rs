//! `shardctl ring simulate`: balance and movement of each routed strategy on a membership change.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shardctl_common::ring::{simulate, DEFAULT_VNODES};

#[derive(Debug, Parser)]
pub struct RingArgs {
    #[command(subcommand)]
    pub command: RingCommand,
}

#[derive(Debug, Subcommand)]
pub enum RingCommand {
    /// Place keys on N nodes, change the membership, and print keys per node and keys moved.
    Simulate(SimulateArgs),
}

#[derive(Debug, Parser)]
pub struct SimulateArgs {
    /// Members before the change.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub nodes: u32,
    /// Members that join.
    #[arg(long, default_value_t = 0)]
    pub add: u32,
    /// Members that leave.
    #[arg(long, default_value_t = 0)]
    pub remove: u32,
    /// Keys to place.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,
    /// Virtual nodes per member (consistent hash).
    #[arg(long, default_value_t = DEFAULT_VNODES, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub vnodes: u32,
}

pub fn run(a: &RingArgs) -> anyhow::Result<ExitCode> {
    let RingCommand::Simulate(s) = &a.command;
    if s.remove >= s.nodes + s.add {
        return Err(shardctl_common::Error::invalid("--remove must leave at least one node").into());
    }
    let after = s.nodes + s.add - s.remove;
    outln!("{} keys, {} -> {} nodes (+{} -{}), {} vnodes per node", s.keys, s.nodes, after, s.add, s.remove, s.vnodes);
    outln!(
        "{:<16} {:>10} {:>12} {:>10} {:>10} {:>9}",
        "strategy",
        "min/node",
        "mean/node",
        "max/node",
        "max/mean",
        "moved"
    );
    for r in simulate(s.nodes as usize, s.add as usize, s.remove as usize, s.keys, s.vnodes) {
        outln!(
            "{:<16} {:>10} {:>12.1} {:>10} {:>10.3} {:>8.1}%",
            r.strategy.as_str(),
            r.min,
            r.mean,
            r.max,
            r.max as f64 / r.mean,
            r.moved * 100.0
        );
    }
    let ideal = if s.add + s.remove == 0 { 0.0 } else { (s.add + s.remove) as f64 / s.nodes.max(after) as f64 };
    outln!("ideal movement for this change: {:.1}%", ideal * 100.0);
    Ok(ExitCode::SUCCESS)
}
