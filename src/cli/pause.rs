//! `shardctl pause` / `shardctl resume`: stop and restart claims on a queue. Running shards go on
//! and finish; nothing is claimed while paused (the claim script checks `meta.paused`).

use std::process::ExitCode;

use redis::AsyncCommands;

use super::{connect, Args};

pub async fn run(args: &Args, paused: bool) -> anyhow::Result<ExitCode> {
    let (_, mut con) = connect(args).await?;
    let keys = args.keys()?;
    if paused {
        let () = con.hset(keys.meta(), "paused", 1).await?;
        println!("queue {} paused: no new claims; running shards finish", args.queue);
    } else {
        let () = con.hdel(keys.meta(), "paused").await?;
        // paused executors block on the markers: wake them all (each passes the wake-up on)
        let nodes: Vec<String> = con.smembers(keys.routed_nodes()).await?;
        let mut pipe = redis::pipe();
        pipe.zadd(keys.marker(), "0", 0).ignore();
        for n in nodes {
            pipe.zadd(keys.node_marker(&n), "0", 0).ignore();
        }
        let () = pipe.query_async(&mut con).await?;
        println!("queue {} resumed", args.queue);
    }
    Ok(ExitCode::SUCCESS)
}
