//! `shardctl config`: the queue's settings stored in Redis (`meta`), shown or changed.

use std::process::ExitCode;

use clap::Parser;
use shardctl_common::{control, durability};

use super::args::{connect, Args};

#[derive(Debug, Parser)]
pub struct ConfigArgs {
    /// Cap of the event log (approximate, MAXLEN ~); 0 turns events off.
    #[arg(long)]
    pub events_maxlen: Option<u64>,
    /// Log one event per completed shard (costs a command per shard; off by default).
    #[arg(long, value_parser = on_off)]
    pub events_completions: Option<bool>,
    /// Spread new tasks over K partitions, each in a hash slot of its own (1 to 64; 1: one slot,
    /// the default). On a Redis Cluster the partitions land on distinct masters while there
    /// are enough. Refused while a task over partitions is unfinished; running executors and
    /// coordinators follow a change within 2 s (a node drains its running shards for its grace
    /// time, then serves the new partitions).
    #[arg(long, value_name = "K")]
    pub partitions: Option<u32>,
    /// Cap a group: at most N shards of its tasks run at once across the cluster (`NAME=none`
    /// removes the cap). Repeat for several groups.
    #[arg(long, value_name = "NAME=N", value_parser = group_cap)]
    pub group_max_running: Vec<(String, Option<u64>)>,
    /// A group's weight beside the other groups and lone tasks of a priority (1 to 1000; 1 by
    /// default). Repeat for several groups.
    #[arg(long, value_name = "NAME=W", value_parser = group_weight)]
    pub group_weight: Vec<(String, u32)>,
    /// What a write a promise depends on (an aggregation's claim, a completion, a result)
    /// must reach before anything acts on it: none (the default) or replica (one replica
    /// acknowledged it, so a failover to that replica keeps it). Refused when the server has no
    /// replica in sync now; running processes follow a change within 2 s. See
    /// docs/operations.md for what survives which failure.
    #[arg(long, value_name = "MODE", value_parser = durability_mode)]
    pub durability: Option<durability::Mode>,
    /// How long one wait for a replica may take before it is reported and repeated (10ms to
    /// 5s; default 1s).
    #[arg(long, value_name = "D", value_parser = shardctl_common::time::parse_duration)]
    pub durability_timeout: Option<std::time::Duration>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn named<'a>(s: &'a str, what: &str) -> Result<(String, &'a str), String> {
    let (name, v) = s.split_once('=').ok_or_else(|| format!("'{s}': expected NAME={what}"))?;
    shardctl_common::names::validate_group(name).map_err(|e| e.to_string())?;
    Ok((name.to_owned(), v))
}

fn group_cap(s: &str) -> Result<(String, Option<u64>), String> {
    let (name, v) = named(s, "N")?;
    if v == "none" {
        return Ok((name, None));
    }
    match v.parse::<u64>() {
        Ok(n) if n >= 1 => Ok((name, Some(n))),
        _ => Err(format!("'{v}': expected a number of shards (at least 1) or none")),
    }
}

fn group_weight(s: &str) -> Result<(String, u32), String> {
    let (name, v) = named(s, "W")?;
    match v.parse::<u32>() {
        Ok(w) if (1..=shardctl_common::model::MAX_WEIGHT).contains(&w) => Ok((name, w)),
        _ => Err(format!("'{v}': expected a weight of 1 to {}", shardctl_common::model::MAX_WEIGHT)),
    }
}

fn durability_mode(s: &str) -> Result<durability::Mode, String> {
    durability::Mode::parse(s).map_err(|e| e.to_string())
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("'{s}': expected on or off")),
    }
}

pub async fn run(args: &Args, a: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let (endpoint, mut con) = connect(args).await?;
    let home = args.home()?;
    let layout = match a.partitions {
        Some(k) => {
            let layout = shardctl_common::partition::set_count(&mut con, &home, k, endpoint.is_cluster()).await?;
            // the groups' caps and weights over the new partitions
            control::reapply_groups(&mut con, &home).await?;
            layout
        }
        None => shardctl_common::partition::layout(&mut con, &home).await?,
    };
    // on a cluster, where each partition lies now
    let masters: Option<Vec<String>> =
        if endpoint.is_cluster() { shardctl_common::partition::masters_of(&mut con, &layout).await? } else { None };
    if a.durability.is_some() || a.durability_timeout.is_some() {
        let mut d = durability::read(&mut con, &home).await?;
        d.mode = a.durability.unwrap_or(d.mode);
        d.timeout = a.durability_timeout.unwrap_or(d.timeout);
        d.validate()?;
        // every slot a task of this queue writes must keep it now
        for keys in layout.partitions.iter().chain([home.keys()]) {
            durability::check(&mut con, keys, &d).await?;
        }
        durability::store(&mut con, &home, &d).await?;
        // the setting itself reached a replica: a failover does not take it back unseen
        let mut reads = redis::pipe();
        reads.cmd("HGET").arg(home.meta()).arg("durability");
        let c = durability::confirm(&mut con, home.keys(), &d, &reads).await?;
        if !c.durable || c.read::<Option<String>>(0)?.as_deref() != Some(d.mode.as_str()) {
            anyhow::bail!(
                "durability {} was stored, but no replica acknowledged it within {:?} ({}): run config again",
                d.mode.as_str(),
                d.timeout,
                c.acks
            );
        }
    }
    let mut changes: Vec<control::GroupChange> = Vec::new();
    for (name, cap) in &a.group_max_running {
        changes.push(control::GroupChange { name: name.clone(), max_running: Some(*cap), weight: None });
    }
    for (name, w) in &a.group_weight {
        changes.push(control::GroupChange { name: name.clone(), max_running: None, weight: Some(*w) });
    }
    if !changes.is_empty() {
        control::set_groups(&mut con, &home, &changes).await?;
    }
    let s = control::queue_settings(&mut con, &home, a.events_maxlen, a.events_completions).await?;
    if a.json {
        outln!("{}", shardctl::json::settings(&args.queue, &s, &layout, masters.as_deref()));
    } else {
        for l in shardctl::text::settings(&args.queue, &s, &layout, masters.as_deref()) {
            outln!("{l}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
