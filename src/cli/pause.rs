//! `shardctl pause` / `shardctl resume`: stop and restart claims on a queue. Running shards go on
//! and finish; nothing is claimed while paused (the claim script checks `meta.paused`).

use std::process::ExitCode;

use shardctl_common::control;

use super::args::{connect, Args};

pub async fn run(args: &Args, paused: bool) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let home = args.home()?;
    if paused {
        control::pause(&mut con, &home).await?;
        outln!("queue {} paused: no new claims; running shards finish", args.queue);
    } else {
        control::resume(&mut con, &home).await?;
        outln!("queue {} resumed", args.queue);
    }
    Ok(ExitCode::SUCCESS)
}
