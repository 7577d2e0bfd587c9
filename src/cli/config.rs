//! `shardctl config`: the queue's settings stored in Redis (`meta`), shown or changed.

use std::process::ExitCode;

use clap::Parser;
use redis::AsyncCommands;

use super::{connect, Args};

/// Default cap of the event log.
pub const DEFAULT_EVENTS_MAXLEN: u64 = 10_000;

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
    let meta = args.keys()?.meta();
    if let Some(n) = a.events_maxlen {
        let () = con.hset(&meta, "events_maxlen", n).await?;
    }
    if let Some(on) = a.events_completions {
        let () = con.hset(&meta, "events_completions", u8::from(on)).await?;
    }
    let (maxlen, completions, paused): (Option<u64>, Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(&meta)
        .arg(&["events_maxlen", "events_completions", "paused"])
        .query_async(&mut con)
        .await?;
    let maxlen = maxlen.unwrap_or(DEFAULT_EVENTS_MAXLEN);
    let completions = completions.as_deref() == Some("1");
    let paused = paused.as_deref() == Some("1");
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "queue": args.queue, "events_maxlen": maxlen, "events_completions": completions, "paused": paused })
        );
    } else {
        println!("queue {}", args.queue);
        println!("events_maxlen      {maxlen}{}", if maxlen == 0 { " (events off)" } else { "" });
        println!("events_completions {}", if completions { "on" } else { "off" });
        println!("paused             {paused}");
    }
    Ok(ExitCode::SUCCESS)
}
