//! `shardctl watch`: tails the queue's event log live (best effort: capped, never counted from).

use std::process::ExitCode;

use clap::Parser;
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;

use super::args::{connect, Args};

#[derive(Debug, Parser)]
pub struct WatchArgs {
    /// Only this task's events.
    #[arg(long)]
    pub task: Option<String>,
    /// Start with the events already in the log (default: only new ones).
    #[arg(long)]
    pub from_start: bool,
    /// Stop after this many events (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// Print each event as a JSON line.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &Args, a: &WatchArgs) -> anyhow::Result<ExitCode> {
    if let Some(t) = &a.task {
        super::args::task_id(t)?;
    }
    let (endpoint, mut plain) = connect(args).await?;
    let keys = args.keys()?;
    // what is to come, on stderr (stdout holds only events): an empty or disabled log waits
    // silently otherwise
    let settings = shardctl_common::control::queue_settings(&mut plain, &keys, None, None).await?;
    // best effort: the minimal ACL of docs/operations.md has no XLEN
    let kept: Option<u64> = redis::cmd("XLEN").arg(keys.events()).query_async(&mut plain).await.ok();
    let q = &args.queue;
    if settings.events_maxlen == 0 {
        eprintln!(
            "note: the event log of queue {q} is off (`shardctl config --events-maxlen N` turns it on): \
             nothing comes until then"
        );
    } else if a.from_start && kept == Some(0) {
        eprintln!("note: the event log of queue {q} is empty; waiting for events");
    } else if !a.from_start {
        let older = match kept {
            Some(0) => "none yet".to_owned(),
            Some(1) => "1 older one kept: --from-start shows it".to_owned(),
            Some(n) => format!("{n} older ones kept: --from-start shows them"),
            None => "--from-start shows the older ones".to_owned(),
        };
        eprintln!("note: showing the events of queue {q} as they come ({older})");
    }
    // a blocking read needs a connection of its own with a response timeout past the block
    let mut con = endpoint.blocking(std::time::Duration::from_secs(5)).await?;
    // a partitioned queue: the per-shard events (`shard_*`) happen in the partitions' logs, at
    // the shares' own indexes; they are merged in, at the task's indexes
    let mut layout = shardctl_common::partition::layout(&mut plain, &keys).await?;
    let start = if a.from_start {
        "0-0".to_owned()
    } else {
        // "$" would need a blocking read per stream: the server's time now stands for it
        format!("{}-0", shardctl_common::time::server_now_ms(&mut plain, &keys).await?)
    };
    // each log with its partition's number (1-based) and keys, and the last id read
    type Stream = (String, Option<(u32, shardctl_common::Keys)>, String);
    let mut streams: Vec<Stream> = vec![(keys.events(), None, start.clone())];
    for (p, pk) in layout.parts.iter().enumerate() {
        streams.push((pk.events(), Some((p as u32 + 1, pk.clone())), start.clone()));
    }
    let mut bases: std::collections::HashMap<(String, String), u64> = std::collections::HashMap::new();
    let mut seen = 0u64;
    let mut checked = std::time::Instant::now();
    let mut checked_ms = shardctl_common::time::server_now_ms(&mut plain, &keys).await?;
    loop {
        // a change of the queue's partitions: the new ones' logs are read from the check before
        if checked.elapsed() >= shardctl_common::partition::LAYOUT_CHECK {
            checked = std::time::Instant::now();
            let since =
                std::mem::replace(&mut checked_ms, shardctl_common::time::server_now_ms(&mut plain, &keys).await?);
            let now = shardctl_common::partition::layout(&mut plain, &keys).await?;
            if now != layout {
                let from = format!("{since}-0");
                for (p, pk) in now.parts.iter().enumerate() {
                    if !streams.iter().any(|(k, _, _)| *k == pk.events()) {
                        streams.push((pk.events(), Some((p as u32 + 1, pk.clone())), from.clone()));
                    }
                }
                layout = now;
            }
        }
        let mut round: Vec<(String, Vec<(String, String)>)> = Vec::new();
        for (key, part, last) in streams.iter_mut() {
            // the home blocks when it is the only stream, the partitions are read as they are
            let opts = if part.is_none() && layout.parts.is_empty() {
                StreamReadOptions::default().block(5000).count(500)
            } else {
                StreamReadOptions::default().count(500)
            };
            let c = if part.is_none() && layout.parts.is_empty() { &mut con } else { &mut plain };
            let reply: Option<StreamReadReply> = c.xread_options(&[&*key], &[&*last], &opts).await?;
            for stream in reply.map(|r| r.keys).unwrap_or_default() {
                for entry in stream.ids {
                    *last = entry.id.clone();
                    let mut fields: Vec<(String, String)> = entry
                        .map
                        .iter()
                        .map(|(k, v)| (k.clone(), redis::from_redis_value_ref::<String>(v).unwrap_or_default()))
                        .collect();
                    if let Some((p, pk)) = part {
                        let Some(task) = shardctl_coordinator::inspect::share_event_task(&fields) else { continue };
                        let base = match bases.get(&(key.clone(), task.clone())) {
                            Some(b) => *b,
                            None => {
                                let b: Option<u64> =
                                    redis::cmd("HGET").arg(pk.task(&task)).arg("base").query_async(&mut plain).await?;
                                let b = b.unwrap_or(0);
                                bases.insert((key.clone(), task.clone()), b);
                                b
                            }
                        };
                        shardctl_coordinator::inspect::as_task_event(&mut fields, *p, base);
                    }
                    round.push((entry.id.clone(), fields));
                }
            }
        }
        if round.is_empty() && !layout.parts.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        // in time order across the logs (ids are `<ms>-<seq>`)
        round.sort_by_key(|(id, _)| {
            let (ms, n) = id.split_once('-').unwrap_or((id, "0"));
            (ms.parse::<u64>().unwrap_or(0), n.parse::<u64>().unwrap_or(0))
        });
        for (id, mut fields) in round {
            // a stable order: task and shard first, the rest by name
            let rank = |k: &str| match k {
                "event" => 0,
                "task" => 1,
                "shard" => 2,
                _ => 3,
            };
            fields.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
            let get = |f: &str| fields.iter().find(|(k, _)| k == f).map(|(_, v)| v.as_str());
            if a.task.as_deref().is_some_and(|t| get("task") != Some(t)) {
                continue;
            }
            print_event(&id, &fields, a.json);
            seen += 1;
            if a.count.is_some_and(|c| seen >= c) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
}

fn print_event(id: &str, fields: &[(String, String)], json: bool) {
    let ms: u64 = id.split('-').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if json {
        outln!("{}", shardctl::json::event(id, fields));
        return;
    }
    let t = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    let event = fields.iter().find(|(k, _)| k == "event").map_or("?", |(_, v)| v.as_str());
    let rest: Vec<String> = fields.iter().filter(|(k, _)| k != "event").map(|(k, v)| format!("{k}={v}")).collect();
    outln!("{t} {event:<18} {}", rest.join(" "));
}
