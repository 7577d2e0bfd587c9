//! `shardctl config`: the queue's settings stored in Redis (`meta`), shown or changed.

use std::process::ExitCode;

use clap::Parser;
use shardctl_common::control;

use super::{connect, Args};

#[derive(Debug, Parser)]
pub struct ConfigArgs {
    /// Cap of the event log (approximate, MAXLEN ~); 0 turns events off.
    #[arg(long)]
    pub events_maxlen: Option<u64>,
    /// Log one event per completed shard (costs a command per shard; off by default).
    #[arg(long, value_parser = on_off)]
    pub events_completions: Option<bool>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("'{s}': expected on or off")),
    }
}

pub async fn run(args: &Args, a: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let s = control::queue_settings(&mut con, &args.keys()?, a.events_maxlen, a.events_completions).await?;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "queue": args.queue,
                "events_maxlen": s.events_maxlen,
                "events_completions": s.events_completions,
                "paused": s.paused,
            })
        );
    } else {
        outln!("queue {}", args.queue);
        outln!("events_maxlen      {}{}", s.events_maxlen, if s.events_maxlen == 0 { " (events off)" } else { "" });
        outln!("events_completions {}", if s.events_completions { "on" } else { "off" });
        outln!("paused             {}", s.paused);
    }
    Ok(ExitCode::SUCCESS)
}
