//! Dispatch of a pull task: validate, then one script call that stores the task hash and puts
//! the task in the runnable set. O(1) in time and Redis memory whatever the shard count. Also
//! the reading of what a task is dispatched with: a payload file, a keys file.

use redis::aio::ConnectionLike;
use shardctl_common::model::{TaskSpec, MAX_PAYLOAD_BYTES};
use shardctl_common::time::now_ms;
use shardctl_common::{scripts, Error, Home, Result, ScriptCode};

/// A fresh task id: time-ordered and unique enough across coordinators.
pub fn new_task_id() -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    format!("t{}-{}", now_ms(), &u[..8])
}

/// Validates `spec` and creates the task's record, nothing more: a pull task is then complete
/// and claimable, a routed one waits unplaced for a rebalancer ([`dispatch`] places it at once).
/// An id already in use is refused ([`ScriptCode::TaskExists`]).
pub async fn create_task<C: ConnectionLike + Send>(con: &mut C, home: &Home, spec: &TaskSpec) -> Result<()> {
    spec.validate()?;
    // a partitioned queue: a home record and one share per partition
    if crate::partition::create_over(con, home, spec, None).await?.is_some() {
        return Ok(());
    }
    match scripts::dispatch(con, home, spec).await {
        Err(Error::Script(c @ ScriptCode::TaskExists)) => Err(taken(c, &spec.id)),
        other => other,
    }
}

fn taken(code: ScriptCode, id: &str) -> Error {
    Error::refused(code, format!("a task with id '{id}' already exists in this queue"))
}

/// How a dispatch went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched {
    /// The task existed, unplaced, and this dispatch resumed its placement.
    pub resumed: bool,
    /// Shards of the task placed on nodes once this call returns, by it or by a rebalancer that
    /// raced it (routed tasks).
    pub placed: u64,
    /// Live executors at dispatch (routed tasks).
    pub live: usize,
}

/// Dispatches a task of any strategy: creates it ([`create_task`]) and places a routed one on
/// the live executors' lists in chunks; with none alive it waits, unplaced, for the first one. Crash-safe: re-running the
/// same dispatch (same id and spec) on a task whose placement was cut short completes it.
/// `shard_keys` (one per shard) replaces the index as each shard's routing key. Returns once the
/// records reached what the queue's durability asks ([`crate::confirm::dispatch`]).
pub async fn dispatch(
    con: &mut shardctl_common::conn::Conn,
    home: &Home,
    spec: &TaskSpec,
    shard_keys: Option<&[String]>,
) -> Result<Dispatched> {
    let since = crate::confirm::before_dispatch(con, home, &spec.id).await?;
    let d = create_and_place(con, home, spec, shard_keys).await?;
    // the id is given out once the records are durable (the queue's durability; at once with none)
    crate::confirm::dispatch(con, home, &spec.id, since).await?;
    // the queue is listed for every dashboard of its prefix (docs/design/dashboard.md): once a
    // task of it exists (a refused dispatch writes nothing)
    shardctl_common::queues::register(con, home).await;
    Ok(d)
}

/// [`dispatch`]'s work: the task created, a routed one placed.
async fn create_and_place(
    con: &mut shardctl_common::conn::Conn,
    home: &Home,
    spec: &TaskSpec,
    shard_keys: Option<&[String]>,
) -> Result<Dispatched> {
    use redis::AsyncCommands;
    use shardctl_common::ring::Strategy;

    if spec.strategy == Strategy::Pull && shard_keys.is_some() {
        return Err(Error::invalid(
            "shard keys need a routed strategy (consistent-hash, round-robin, hash-mod), not pull",
        ));
    }
    if let Some(k) = shard_keys {
        if k.len() as u64 != spec.shards || !spec.has_keys {
            return Err(Error::invalid(format!("{} keys given for {} shards", k.len(), spec.shards)));
        }
    }
    if spec.strategy != Strategy::Pull {
        // a routed task over partitions: its shares (and their keys) placed in each
        if let Some(layout) = crate::partition::create_over(con, home, spec, shard_keys).await? {
            if spec.delay.is_some() {
                return Ok(Dispatched { resumed: false, placed: 0, live: 0 });
            }
            let (placed, live) = crate::partition::route(con, &layout, &spec.id).await?;
            return Ok(Dispatched { resumed: false, placed, live });
        }
    }
    if spec.strategy == Strategy::Pull {
        create_task(con, home, spec).await?;
        return Ok(Dispatched { resumed: false, placed: 0, live: 0 });
    }
    spec.validate()?;
    let existing = crate::progress::task(con, home, &spec.id).await;
    let resumed = match existing {
        Ok(t) => {
            if !spec.matches(&t) || t.routed.is_none_or(|r| r >= t.total) {
                return Err(taken(ScriptCode::TaskExists, &spec.id));
            }
            true
        }
        Err(Error::NoTask(_)) => false,
        Err(e) => return Err(e),
    };
    if let (Some(k), false) = (shard_keys, resumed) {
        // keys first: once the task exists, any rebalancer may place it and needs them
        for (c, chunk) in k.chunks(crate::route::CHUNK).enumerate() {
            let base = c * crate::route::CHUNK;
            let pairs: Vec<(usize, &String)> = chunk.iter().enumerate().map(|(i, k)| (base + i, k)).collect();
            let _: () = con.hset_multiple(home.shard_keys(&spec.id), &pairs).await?;
        }
    }
    if !resumed {
        create_task(con, home, spec).await?;
    }
    if spec.delay.is_some() {
        // a delayed task is placed when it starts (`start_due_tasks` of lua/include/due.lua, then a rebalancer)
        return Ok(Dispatched { resumed, placed: 0, live: 0 });
    }
    let live = crate::membership::live(con, home).await?;
    if live.is_empty() {
        return Ok(Dispatched { resumed, placed: 0, live: 0 });
    }
    let n = live.len();
    crate::route::Router::over(con, home, live).await?.route_task(con, home, &spec.id).await?;
    let placed: Option<u64> = con.hget(home.task(&spec.id), "routed").await?;
    Ok(Dispatched { resumed, placed: placed.unwrap_or(0), live: n })
}

/// The routing keys of a keys file (`dispatch --keys-file`): one per non-empty line, a trailing
/// `\r` removed; a file with none is refused.
pub fn read_keys_file(path: &std::path::Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("cannot read keys file {}: {e}", path.display())))?;
    let keys: Vec<String> =
        text.lines().map(|l| l.trim_end_matches('\r')).filter(|l| !l.is_empty()).map(str::to_owned).collect();
    if keys.is_empty() {
        return Err(Error::invalid(format!("keys file {} has no keys", path.display())));
    }
    Ok(keys)
}

/// A task's payload read from a file (`-`: stdin), at most [`MAX_PAYLOAD_BYTES`] of UTF-8 (read
/// up to one byte past the limit, never more).
pub fn read_payload_file(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let limit = MAX_PAYLOAD_BYTES as u64 + 1;
    let mut buf = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().take(limit).read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut buf))
    };
    read.map_err(|e| Error::invalid(format!("cannot read payload file {}: {e}", path.display())))?;
    if buf.len() as u64 == limit {
        return Err(Error::invalid(format!(
            "payload file {} is over the limit of {} bytes (1 MiB)",
            path.display(),
            limit - 1
        )));
    }
    String::from_utf8(buf).map_err(|_| Error::invalid("payload file is not UTF-8"))
}
