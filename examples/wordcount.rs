//! A handler and an aggregator of your own, through the library API: count the words and lines
//! of a file split into byte ranges, one shard per range, then check against a direct count.
//!
//! ```text
//! cargo run --example wordcount -- [FILE] [--shards N] [--redis URL]
//! ```
//! Without FILE it writes a sample file; without `--redis` it starts a private redis-server.
//!
//! A word belongs to the shard in whose range it starts: a shard looks one byte back to know
//! whether its first byte starts a word, so words across range boundaries are counted once.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use serde_json::{json, Value};
use shardctl::common::conn;
use shardctl::{
    dispatch, wait, AggregateContext, Aggregator, BoxFuture, ExecutorConfig, Handler, Home, Node, NodeConfig, Registry,
    ShardContext, ShardError, TaskSpec,
};
use tokio_util::sync::CancellationToken;

/// Counts what starts in `[start, end)` of a file.
struct WordCount;

#[derive(serde::Deserialize)]
struct Payload {
    path: String,
}

/// Words and lines that start in `buf[from..]`, given the byte before `buf[from]`.
fn count(buf: &[u8], before: Option<u8>) -> (u64, u64) {
    let mut prev_space = before.is_none_or(|b| b.is_ascii_whitespace());
    let (mut words, mut lines) = (0, 0);
    for &b in buf {
        let space = b.is_ascii_whitespace();
        if !space && prev_space {
            words += 1;
        }
        if b == b'\n' {
            lines += 1;
        }
        prev_space = space;
    }
    (words, lines)
}

impl Handler for WordCount {
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let p: Payload = ctx.payload_as()?;
            let range = ctx.range.clone();
            // file reading and counting are blocking work: rayon, not the runtime threads
            let (words, lines) = ctx
                .cpu(move || -> std::io::Result<(u64, u64)> {
                    let mut f = File::open(&p.path)?;
                    let back = u64::from(range.start > 0);
                    f.seek(SeekFrom::Start(range.start - back))?;
                    let mut buf = vec![0; (range.end - range.start + back) as usize];
                    f.read_exact(&mut buf)?;
                    let before = (back == 1).then(|| buf[0]);
                    Ok(count(&buf[back as usize..], before))
                })
                .await??;
            Ok(json!({ "words": words, "lines": lines }))
        })
    }
}

/// Sums the shards' counts.
struct Total;

impl Aggregator for Total {
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>> {
        Box::pin(async move {
            let (mut words, mut lines) = (0, 0);
            for o in ctx.results.iter() {
                let r = o.result.as_ref().map_err(|e| ShardError::new(format!("shard {} failed: {e}", o.index)))?;
                // a result this aggregator cannot read is refused, never counted as 0
                let count = |field: &str| {
                    r[field]
                        .as_u64()
                        .ok_or_else(|| ShardError::new(format!("shard {} returned {r}, not word counts", o.index)))
                };
                words += count("words")?;
                lines += count("lines")?;
            }
            Ok(json!({ "words": words, "lines": lines, "shards": ctx.total }))
        })
    }
}

fn sample_file() -> std::io::Result<std::path::PathBuf> {
    let path = std::env::temp_dir().join(format!("shardctl-wordcount-{}.txt", std::process::id()));
    let line = "the quick brown fox jumps over the lazy dog  and\tkeeps running\n";
    std::fs::write(&path, line.repeat(20_000))?;
    Ok(path)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut file, mut shards, mut redis_url) = (None, 64u64, std::env::var("SHARDCTL_REDIS").ok());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--shards" => shards = args.next().ok_or("--shards needs a number")?.parse()?,
            "--redis" => redis_url = Some(args.next().ok_or("--redis needs a URL")?),
            "--help" | "-h" => {
                println!(
                    "wordcount: counts the words of FILE in shards, dispatched, run and waited for from one program\n\n\
                     usage: cargo run --example wordcount -- [FILE] [--shards N] [--redis URL]\n\n\
                     FILE defaults to a generated sample; --redis (or SHARDCTL_REDIS) to a private\n\
                     redis-server started for the run; the queue is SHARDCTL_QUEUE (default `wordcount`)"
                );
                return Ok(());
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}: see --help").into()),
            _ => file = Some(std::path::PathBuf::from(a)),
        }
    }
    let sample = file.is_none();
    let file = match file {
        Some(f) => std::fs::canonicalize(f)?,
        None => sample_file()?,
    };
    let size = std::fs::metadata(&file)?.len();
    if size < shards {
        return Err(format!("{} has {size} bytes: fewer than {shards} shards", file.display()).into());
    }

    let server = redis_url.is_none().then(shardctl_testkit::TestRedis::start);
    let url = redis_url.unwrap_or_else(|| server.as_ref().expect("started").url());
    let queue = std::env::var("SHARDCTL_QUEUE").unwrap_or_else(|_| "wordcount".into());
    let keys = Home::new("shardctl", &queue)?;
    let endpoint = conn::open(&url)?;
    let mut con = endpoint.manager().await?;

    let mut registry = Registry::new();
    registry.handler("wordcount", WordCount).aggregator("wordcount", Total);
    let executor = ExecutorConfig { node_id: "example".into(), concurrency: 4, ..Default::default() };
    let node = Node::start(endpoint, keys.clone(), NodeConfig { executor, ..Default::default() }, registry).await?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(node.run(stop.clone()));

    let id = dispatch::new_task_id();
    let spec = TaskSpec {
        items: size,
        payload: json!({ "path": file }).to_string(),
        ..TaskSpec::new(id.clone(), "wordcount", shards)
    };
    dispatch::create_task(&mut con, &keys, &spec).await?;
    let task = wait::wait(&mut con, &keys, &id, Some(Duration::from_secs(60)), |_| {}).await?;
    stop.cancel();
    running.await??;

    let direct = count(&std::fs::read(&file)?, None);
    let result = task.result.unwrap_or_default();
    println!("{} over {shards} shards: {result}", file.display());
    let expected = json!({ "words": direct.0, "lines": direct.1, "shards": shards });
    if result != expected {
        return Err(format!("mismatch: a direct count gives {expected}").into());
    }
    println!("checked against a direct count: {} words, {} lines", direct.0, direct.1);
    if sample {
        std::fs::remove_file(&file)?;
    }
    Ok(())
}
