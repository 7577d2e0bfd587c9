//! Controls over tasks and queues once dispatched: cancel, clean, pause and resume, the
//! queue's settings, and the queue-wide rate limit the claim script enforces. Each is one script
//! call (or a few hash writes).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::AsyncCommands;

use crate::error::{Error, Result, ScriptCode};
use crate::home::Home;
use crate::keys::Keys;
use crate::scripts::{scripts, KeyArgs};

/// Cancels task `id`: nothing of it is claimed again, its running shards are stopped at their
/// executors' next heartbeat, and it ends `cancelled` without aggregation. Returns how many
/// running shards were stopped. A task that already ended is refused.
pub async fn cancel<C: ConnectionLike + Send>(con: &mut C, home: &Home, id: &str) -> Result<u64> {
    crate::names::validate_task_id(id)?;
    let h: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(home.task(id)).query_async(con).await?;
    let Some(t) = crate::model::TaskInfo::from_hash(id, &h)? else { return cancel_in(con, home, id).await };
    // its home record first (a share that ends meanwhile is not counted any more), then each of
    // its other shares (`crate::share`), whose running shards stop. A cancel cut short after
    // the home is completed by cancelling again (the home, already cancelled, is passed over).
    let shares = crate::share::of(con, home, &t).await?;
    let others: Vec<_> = shares.iter().filter(|s| !s.is_home()).collect();
    let mut stopped = match cancel_in(con, home, id).await {
        Ok(n) => n,
        Err(e)
            if !others.is_empty()
                && t.state == crate::model::TaskState::Cancelled
                && e.script_code() == Some(ScriptCode::TaskEnded) =>
        {
            0
        }
        Err(e) => return Err(e),
    };
    for s in others {
        // a leftover of another incarnation under the id is not this task's
        if crate::share::read(con, &s.keys, id, &t.inc, &[]).await?.is_none() {
            continue;
        }
        match cancel_in(con, &s.keys, id).await {
            Ok(n) => stopped += n,
            // it ended already
            Err(Error::Refused { .. } | Error::NoTask(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(stopped)
}

/// `cancel.lua` on task `id` of one keyspace (the home record, or one share).
pub async fn cancel_in<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, id: &str) -> Result<u64> {
    crate::names::validate_task_id(id)?;
    let code: i64 = scripts()
        .cancel
        .keyed(keys, &KeyArgs { task: Some(id), ..Default::default() })
        .arg(keys.prefix())
        .arg(id)
        .invoke_async(con)
        .await?;
    if code < 0 {
        return Err(crate::error::refused(id, code, "cancel"));
    }
    Ok(code as u64)
}

/// Removes ended tasks whose retention ran out and, with `older_than`, every task that ended at
/// least that long ago (by the Redis server's clock); all their keys go, and the shares of a
/// partitioned queue's removed tasks with them. Returns how many tasks were removed.
pub async fn clean<C: ConnectionLike + Send>(con: &mut C, home: &Home, older_than: Option<Duration>) -> Result<u64> {
    let removed = clean_in(con, home, older_than).await?;
    // a partitioned queue: the shares of the tasks removed go too
    let layout = crate::partition::layout::layout(con, home).await?;
    // (or was: its retired partitions are emptied the same way)
    if removed > 0 || older_than.is_some() {
        crate::partition::layout::drop_orphans(con, &layout).await?;
    }
    Ok(removed)
}

/// `clean.lua` over one keyspace (the home, or a partition's ended share records past their
/// retention) until nothing is left to remove; how many records went.
pub async fn clean_in<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, older_than: Option<Duration>) -> Result<u64> {
    let older = older_than.map_or(-1, |d| d.as_millis() as i64);
    let mut removed = 0;
    loop {
        let (listed, n): (u64, u64) = scripts()
            .clean
            .keyed(keys, &KeyArgs::default())
            .arg(keys.prefix())
            .arg(older)
            .arg(CLEAN_BATCH)
            .invoke_async(con)
            .await?;
        removed += n;
        // entries read, stale ones included: a short batch means none is left
        if listed < CLEAN_BATCH {
            return Ok(removed);
        }
    }
}

/// Tasks removed per `clean` script call (keeps each call short).
const CLEAN_BATCH: u64 = 200;

/// The queue-wide rate limit: at most `max` shards start in any window of `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Shards per window.
    pub max: u64,
    /// The window.
    pub per: Duration,
}

/// Sets (or with `None` removes) the queue's rate limit; claims obey it from their next call.
pub async fn set_limit<C: ConnectionLike + Send + Sync>(
    con: &mut C,
    home: &Home,
    limit: Option<RateLimit>,
) -> Result<()> {
    // a partitioned queue's limit is split evenly over its partitions (each claims in its own
    // slot): ⌈max / K⌉ each, so together they start at most max + K - 1 per window
    let mut layout = crate::partition::layout::layout(con, home).await?;
    loop {
        let k = layout.count() as u64;
        for pk in &layout.partitions {
            set_limit_in(con, pk, limit.map(|l| RateLimit { max: l.max.div_ceil(k), per: l.per })).await?;
        }
        set_limit_in(con, home, limit).await?;
        // a change of the layout meanwhile copied the home's settings before this: again
        match again(con, home, &layout).await? {
            Some(now) => layout = now,
            None => return Ok(()),
        }
    }
}

/// The queue's layout if it is no longer `layout`: a setting written over `layout` while a
/// change of the layout copied the home's settings to its new partitions is written again.
async fn again<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    layout: &crate::partition::layout::Layout,
) -> Result<Option<crate::partition::layout::Layout>> {
    let now = crate::partition::layout::layout(con, home).await?;
    Ok((now != *layout).then_some(now))
}

async fn set_limit_in<C: ConnectionLike + Send + Sync>(
    con: &mut C,
    keys: &Keys,
    limit: Option<RateLimit>,
) -> Result<()> {
    match limit {
        Some(l) => {
            if l.max == 0 || l.per < Duration::from_millis(1) {
                return Err(Error::invalid("a rate limit needs a maximum of at least 1 per window of at least 1ms"));
            }
            let () = con
                .hset_multiple(keys.meta(), &[("limit_max", l.max), ("limit_per_ms", l.per.as_millis() as u64)])
                .await?;
        }
        None => {
            let () = con.hdel(keys.meta(), &["limit_max", "limit_per_ms", "limit_used"]).await?;
            let () = con.del(keys.limiter()).await?;
        }
    }
    // executors waiting out a full window wake and claim under the new limit
    wake_all(con, keys).await
}

/// Wakes one blocked executor of every lane of keyspace `keys`, and one of every routed node
/// (each passes the wake-up on while work is left).
async fn wake_all<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<()> {
    let (kinds, nodes): (Vec<String>, Vec<String>) =
        redis::pipe().smembers(keys.kinds()).smembers(keys.routed_nodes()).query_async(con).await?;
    let mut pipe = redis::pipe();
    pipe.zadd(keys.marker(), "0", 0).ignore().zadd(keys.any_kind_marker(), "0", 0).ignore();
    for k in kinds {
        pipe.zadd(keys.lane_marker(&k), "0", 0).ignore();
    }
    for n in nodes {
        pipe.zadd(keys.node_marker(&n), "0", 0).ignore();
    }
    let () = pipe.query_async(con).await?;
    Ok(())
}

/// The queue's rate limit, if any.
pub async fn limit<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<Option<RateLimit>> {
    let (max, per): (Option<u64>, Option<u64>) =
        redis::cmd("HMGET").arg(home.meta()).arg("limit_max").arg("limit_per_ms").query_async(con).await?;
    Ok(max.zip(per).map(|(max, per)| RateLimit { max, per: Duration::from_millis(per) }))
}

/// Pauses the queue: nothing is claimed while paused (the claim script reads `meta.paused`);
/// running shards go on and finish.
pub async fn pause<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    // the home last: `status` reads it, and says paused only once every partition is
    let mut layout = crate::partition::layout::layout(con, home).await?;
    loop {
        for k in layout.partitions.iter().chain([home.keys()]) {
            let () = redis::cmd("HSET").arg(k.meta()).arg("paused").arg(1).query_async(con).await?;
        }
        match again(con, home, &layout).await? {
            Some(now) => layout = now,
            None => return Ok(()),
        }
    }
}

/// Resumes a paused queue and wakes its blocked executors at once (each passes the wake-up on).
pub async fn resume<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    let mut layout = crate::partition::layout::layout(con, home).await?;
    loop {
        for k in &layout.partitions {
            let () = redis::cmd("HDEL").arg(k.meta()).arg("paused").query_async(con).await?;
            wake_all(con, k).await?;
        }
        let () = redis::cmd("HDEL").arg(home.meta()).arg("paused").query_async(con).await?;
        match again(con, home, &layout).await? {
            Some(now) => layout = now,
            None => break,
        }
    }
    wake_all(con, home).await
}

/// The event log's cap when none is set: the same number as `emit` in `lua/include/events.lua`
/// (a test checks they agree).
pub const DEFAULT_EVENTS_MAXLEN: u64 = 10_000;

/// A queue's settings stored in Redis (`meta`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// Cap of the event log (approximate, `MAXLEN ~`); 0: no events.
    pub events_maxlen: u64,
    /// One event per completed shard (a command per shard).
    pub events_completions: bool,
    /// Nothing is claimed.
    pub paused: bool,
    /// The groups with a setting (docs/design/fairness.md), by name.
    pub groups: std::collections::BTreeMap<String, GroupSettings>,
    /// What a confirmed write reached (docs/design/durability.md).
    pub durability: crate::durability::Durability,
}

/// A group's settings: its weight among the units of a priority, and its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSettings {
    /// Its weight (1 unless set).
    pub weight: u32,
    /// At most this many shards of its tasks held at once, if capped.
    pub max_running: Option<u64>,
}

/// A change of a group's settings: `Some(None)` removes a cap.
#[derive(Debug, Clone, Default)]
pub struct GroupChange {
    /// The group.
    pub name: String,
    /// Its new cap (`Some(None)`: none).
    pub max_running: Option<Option<u64>>,
    /// Its new weight.
    pub weight: Option<u32>,
}

/// Changes groups' settings in every keyspace of the queue (each partition's claims read their
/// own `meta`); a group's cap is split over K partitions as a task's is, each at least 1.
pub async fn set_groups<C: ConnectionLike + Send>(con: &mut C, home: &Home, changes: &[GroupChange]) -> Result<()> {
    for c in changes {
        crate::names::validate_group(&c.name)?;
        if c.max_running == Some(Some(0)) {
            return Err(Error::invalid(format!("group {}: max-running must be at least 1", c.name)));
        }
        if c.weight.is_some_and(|w| !(1..=crate::model::MAX_WEIGHT).contains(&w)) {
            return Err(Error::invalid(format!("group {}: weight must be 1 to {}", c.name, crate::model::MAX_WEIGHT)));
        }
    }
    let layout = crate::partition::layout::layout(con, home).await?;
    let k = layout.partitions.len().max(1) as u32;
    for c in changes {
        let max_field = format!("group_max:{}", c.name);
        let weight_field = format!("group_weight:{}", c.name);
        let mut pipe = redis::pipe();
        // the home keeps the whole cap (what `config` shows) and the weight; each partition
        // its part of the cap and the weight
        match c.max_running {
            Some(Some(n)) => {
                pipe.hset(home.meta(), format!("group_cap:{}", c.name), n).ignore();
            }
            Some(None) => {
                pipe.hdel(home.meta(), format!("group_cap:{}", c.name)).ignore();
            }
            None => {}
        }
        set_group_fields(&mut pipe, &home.meta(), c, &max_field, &weight_field, 1, 1);
        for (i, keys) in layout.partitions.iter().enumerate() {
            set_group_fields(&mut pipe, &keys.meta(), c, &max_field, &weight_field, i as u32 + 1, k);
        }
        let () = pipe.query_async(con).await?;
    }
    Ok(())
}

/// Writes every group's settings again over the queue's current layout (after a change of its
/// partition count: a new partition has none, and a cap is split over the new count).
pub async fn reapply_groups<C: ConnectionLike + Send>(con: &mut C, home: &Home) -> Result<()> {
    let s = queue_settings(con, home, None, None).await?;
    let changes: Vec<GroupChange> = s
        .groups
        .into_iter()
        .map(|(name, g)| GroupChange { name, max_running: Some(g.max_running), weight: Some(g.weight) })
        .collect();
    set_groups(con, home, &changes).await
}

fn set_group_fields(pipe: &mut redis::Pipeline, meta: &str, c: &GroupChange, max: &str, weight: &str, p: u32, k: u32) {
    match c.max_running {
        Some(Some(n)) => {
            pipe.hset(meta, max, crate::partition::layout::share_range(p, k, n).1.max(1)).ignore();
        }
        Some(None) => {
            pipe.hdel(meta, max).ignore();
        }
        None => {}
    }
    if let Some(w) = c.weight {
        if w == 1 {
            pipe.hdel(meta, weight).ignore();
        } else {
            pipe.hset(meta, weight, w).ignore();
        }
    }
}

/// Changes what is given (`None`: left as it is) and returns the settings after.
pub async fn queue_settings<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    events_maxlen: Option<u64>,
    events_completions: Option<bool>,
) -> Result<QueueSettings> {
    let meta = home.meta();
    // a partitioned queue logs in every partition too (shard events happen there)
    let layout = if events_maxlen.is_some() || events_completions.is_some() {
        crate::partition::layout::layout(con, home).await?
    } else {
        crate::partition::layout::Layout { home: home.clone(), partitions: Vec::new() }
    };
    for k in layout.partitions.iter().chain([home.keys()]) {
        if let Some(n) = events_maxlen {
            let () = redis::cmd("HSET").arg(k.meta()).arg("events_maxlen").arg(n).query_async(con).await?;
        }
        if let Some(on) = events_completions {
            let () =
                redis::cmd("HSET").arg(k.meta()).arg("events_completions").arg(u8::from(on)).query_async(con).await?;
        }
    }
    let (maxlen, completions, paused): (Option<u64>, Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(&meta).arg(&["events_maxlen", "events_completions", "paused"]).query_async(con).await?;
    let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL").arg(&meta).query_async(con).await?;
    let mut groups = std::collections::BTreeMap::new();
    for f in all.keys() {
        if let Some(name) = f.strip_prefix("group_cap:").or_else(|| f.strip_prefix("group_weight:")) {
            let weight = all.get(&format!("group_weight:{name}")).and_then(|v| v.parse().ok()).unwrap_or(1);
            let max_running = all.get(&format!("group_cap:{name}")).and_then(|v| v.parse().ok());
            groups.insert(name.to_owned(), GroupSettings { weight, max_running });
        }
    }
    Ok(QueueSettings {
        events_maxlen: maxlen.unwrap_or(DEFAULT_EVENTS_MAXLEN),
        events_completions: completions.as_deref() == Some("1"),
        paused: paused.as_deref() == Some("1"),
        durability: crate::durability::read(con, home).await?,
        groups,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_events_cap_is_the_scripts_own() {
        let lib = include_str!("../../lua/include/events.lua");
        let want = format!("rcall('HGET', K.meta, 'events_maxlen') or '{}'", super::DEFAULT_EVENTS_MAXLEN);
        assert!(lib.contains(&want), "events.lua's emit must default to {}", super::DEFAULT_EVENTS_MAXLEN);
    }
}
