//! The JSON API (docs/dashboard.md): reads, each bounded by what it returns, and the actions.

use hyper::body::Bytes;
use serde_json::{json, Value};
use shardctl_common::conn::Conn;
use shardctl_common::model::TaskInfo;
use shardctl_common::{control, schedule, Error, Home};
use shardctl_coordinator::inspect::{self, TaskFilter};
use shardctl_coordinator::shard_map;
use shardctl_coordinator::{presence, progress, stuck};
use std::collections::HashMap;
use std::ops::RangeInclusive;

use super::reply::Reply;
use super::settings::Dashboard;

/// The query parameters each read takes; any other is refused (400). Every read but `queues`
/// takes `queue` too (docs/design/dashboard.md, "Every queue of the Redis").
pub fn params(path: &[&str]) -> &'static [&'static str] {
    match path {
        ["tasks"] => &["state", "offset", "limit", "queue"],
        ["tasks", _, "failed"] => &["cursor", "count", "queue"],
        ["tasks", _, "map"] => &["cells", "queue"],
        ["events"] => &["count", "queue"],
        ["queues"] => &[],
        _ => &["queue"],
    }
}

/// The queue a request names (`queue=NAME`), or the dashboard's own; 400 for a name that is not
/// a queue name.
pub fn home_of(d: &Dashboard, query: &HashMap<String, String>) -> Result<Home, Reply> {
    match query.get("queue") {
        None => Ok(d.home.clone()),
        Some(q) if q == d.home.queue() => Ok(d.home.clone()),
        Some(q) => Home::new(d.home.names().0, q).map_err(|e| Reply::error(400, e)),
    }
}

/// Answers a read (`GET /api/<path>`; `info` is answered without Redis, by [`info`]).
pub async fn read(d: &Dashboard, path: &[&str], query: &HashMap<String, String>) -> (u16, Bytes) {
    let home = match home_of(d, query) {
        Ok(h) => h,
        Err(reply) => return (reply.status, reply.body),
    };
    let v = View { con: &d.con, home: &home };
    let r = match path {
        ["queue"] => queue(v).await,
        ["queues"] => queues(d).await,
        ["tasks"] => tasks(v, query).await,
        ["tasks", id] => task(v, id).await,
        ["tasks", id, "failed"] => failed(v, id, query).await,
        ["tasks", id, "map"] => map(v, id, query).await,
        ["tasks", id, "failures"] => failures(v, id).await,
        ["schedules"] => schedules(v).await,
        ["events"] => events(v, query).await,
        _ => Err(Reply::error(404, format!("no API endpoint /api/{}", path.join("/")))),
    };
    match r {
        Ok(v) => (200, Bytes::from(v.to_string())),
        Err(reply) => (reply.status, reply.body),
    }
}

/// Runs an action (`POST /api/<path>`, already authorized) on the dashboard's own queue: one
/// that names another (`queue=NAME`) answers 403.
pub async fn act(d: &Dashboard, path: &[&str], query: &HashMap<String, String>) -> Reply {
    if let Some(k) = query.keys().find(|k| k.as_str() != "queue") {
        return Reply::error(400, format!("unknown query parameter '{k}' (an action takes: queue)"));
    }
    match home_of(d, query) {
        Ok(h) if h == d.home => {}
        Ok(h) => {
            return Reply::error(
                403,
                format!(
                "this dashboard acts on queue '{}' only: queue '{}' is read-only here (act from its own coordinator)",
                d.home.queue(),
                h.queue()
            ),
            )
        }
        Err(r) => return r,
    }
    let mut con = d.con.clone();
    let done = match path {
        ["queue", "pause"] => control::pause(&mut con, &d.home).await.map(|()| json!({ "paused": true })),
        ["queue", "resume"] => control::resume(&mut con, &d.home).await.map(|()| json!({ "paused": false })),
        ["tasks", id, "cancel"] => match checked(id) {
            Ok(id) => control::cancel(&mut con, &d.home, id).await.map(|n| json!({ "task_id": id, "stopped": n })),
            Err(e) => return e,
        },
        ["tasks", id, "retry"] => match checked(id) {
            Ok(id) => {
                shardctl_common::retry::retry(&mut con, &d.home, id).await.map(|n| json!({ "task_id": id, "again": n }))
            }
            Err(e) => return e,
        },
        _ => return Reply::error(404, format!("no action /api/{}", path.join("/"))),
    };
    match done {
        Ok(v) => {
            tracing::info!(action = %path.join("/"), "dashboard action");
            Reply::json(200, v.to_string())
        }
        Err(e) => failure(e),
    }
}

/// An error of the data layer as a reply: bad input 400, no such task 404, refused 409, Redis
/// 503.
fn failure(e: Error) -> Reply {
    match e {
        Error::Invalid(m) => Reply::error(400, m),
        Error::NoTask(id) => Reply::error(404, format!("no task '{id}'")),
        e @ Error::Refused { .. } => Reply::error(409, e),
        e => Reply::error(503, format!("redis: {e}")),
    }
}

fn checked(id: &str) -> Result<&str, Reply> {
    shardctl_common::names::validate_task_id(id).map_err(|e| Reply::error(400, e))?;
    Ok(id)
}

/// A query parameter as a number of at least `min`, `default` when absent.
fn number(query: &HashMap<String, String>, name: &str, default: u64, range: RangeInclusive<u64>) -> Result<u64, Reply> {
    match query.get(name) {
        None => Ok(default),
        Some(v) => v.parse().ok().filter(|n| range.contains(n)).ok_or_else(|| {
            let (lo, hi) = (range.start(), range.end());
            let bound = if *hi == u64::MAX { format!("at least {lo}") } else { format!("from {lo} to {hi}") };
            Reply::error(400, format!("{name} must be a number {bound}, got '{v}'"))
        }),
    }
}

/// What a read reads: the queue it names, through the dashboard's connection.
#[derive(Clone, Copy)]
struct View<'a> {
    con: &'a Conn,
    home: &'a Home,
}

/// A task without its payload and result (what a map or a page of reasons needs); 404 if none.
async fn light_task(v: View<'_>, id: &str) -> Result<TaskInfo, Reply> {
    let mut con = v.con.clone();
    let found = inspect::tasks_without_payload(&mut con, v.home, &[id.to_owned()]).await.map_err(failure)?;
    found.into_iter().next().flatten().ok_or_else(|| Reply::error(404, format!("no task '{id}'")))
}

/// `GET /api/info`: static, no Redis.
pub fn info(d: &Dashboard) -> Value {
    json!({
        "queue": d.home.queue(),
        "version": env!("CARGO_PKG_VERSION"),
        "read_only": d.read_only(),
        "refresh_ms": super::reads::FRESH.as_millis() as u64,
    })
}

async fn queue(v: View<'_>) -> Result<Value, Reply> {
    let mut con = v.con.clone();
    let k = v.home;
    let counts = progress::shard_counts(&mut con, k).await.map_err(failure)?;
    let limit = control::limit(&mut con, k).await.map_err(failure)?;
    let executors = progress::nodes(&mut con, k).await.map_err(failure)?;
    let coordinators = presence::live(&mut con, k).await.map_err(failure)?;
    let (unfinished, finished, all): (u64, u64, u64) = redis::pipe()
        .zcard(k.running())
        .zcard(k.finished())
        .zcard(k.index())
        .query_async(&mut con)
        .await
        .map_err(|e| failure(e.into()))?;
    Ok(json!({
        "queue": k.queue(),
        "paused": counts.paused,
        "waiting": counts.waiting,
        "active": counts.active,
        "delayed": counts.delayed,
        "limit": limit.map(|l| json!({ "max": l.max, "per_ms": l.per.as_millis() as u64 })),
        "tasks": { "unfinished": unfinished, "finished": finished, "all": all },
        "executors": executors,
        "coordinators": coordinators.into_iter().map(|(c, _)| c).collect::<Vec<_>>(),
    }))
}

/// `GET /api/queues`: every queue of the prefix (`shardctl_common::queues`), each with its task
/// counts and whether it is paused, and which one this dashboard maintains.
async fn queues(d: &Dashboard) -> Result<Value, Reply> {
    let mut con = d.con.clone();
    let (prefix, own) = d.home.names();
    let (mut names, more) = shardctl_common::queues::list(&mut con, prefix).await.map_err(failure)?;
    if !names.iter().any(|n| n == own) {
        names.insert(0, own.to_owned());
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Ok(k) = Home::new(prefix, &name) else { continue };
        let (unfinished, finished, paused): (u64, u64, Option<String>) = redis::pipe()
            .zcard(k.running())
            .zcard(k.finished())
            .hget(k.meta(), "paused")
            .query_async(&mut con)
            .await
            .map_err(|e| failure(e.into()))?;
        out.push(json!({
            "queue": name,
            "maintained": name == own,
            "paused": paused.as_deref() == Some("1"),
            "tasks": { "unfinished": unfinished, "finished": finished },
        }));
    }
    Ok(json!({ "queues": out, "more": more }))
}

async fn tasks(v: View<'_>, query: &HashMap<String, String>) -> Result<Value, Reply> {
    let filter: TaskFilter =
        query.get("state").map_or("", String::as_str).parse().map_err(|e: String| Reply::error(400, e))?;
    let offset = number(query, "offset", 0, 0..=u64::MAX)?;
    let limit = number(query, "limit", 50, 1..=inspect::MAX_PAGE)?;
    let mut con = v.con.clone();
    let page = inspect::task_page(&mut con, v.home, filter, offset, limit).await.map_err(failure)?;
    serde_json::to_value(page).map_err(|e| Reply::error(500, e))
}

async fn task(v: View<'_>, id: &str) -> Result<Value, Reply> {
    let id = checked(id)?;
    let mut con = v.con.clone();
    let t = progress::task(&mut con, v.home, id).await.map_err(failure)?;
    let why = if t.state.is_finished() {
        Vec::new()
    } else {
        stuck::reasons(&mut con, v.home, &t).await.map_err(failure)?.iter().map(ToString::to_string).collect()
    };
    let payload: Value = serde_json::from_str(&t.payload).unwrap_or_else(|_| Value::String(t.payload.clone()));
    let mut out = serde_json::to_value(&t).map_err(|e| Reply::error(500, e))?;
    out["payload"] = payload;
    out["stuck"] = json!(why);
    Ok(out)
}

async fn failed(v: View<'_>, id: &str, query: &HashMap<String, String>) -> Result<Value, Reply> {
    let id = checked(id)?;
    let cursor = query.get("cursor").map_or("0", String::as_str);
    let count = number(query, "count", 50, 1..=inspect::MAX_PAGE)?;
    let t = light_task(v, id).await?;
    let mut con = v.con.clone();
    let page = inspect::reason_page(&mut con, v.home, &t, cursor, count).await.map_err(failure)?;
    serde_json::to_value(page).map_err(|e| Reply::error(500, e))
}

/// `GET /api/tasks/ID/failures`: its failures grouped by cause (`shardctl_coordinator::failures`).
async fn failures(v: View<'_>, id: &str) -> Result<Value, Reply> {
    let id = checked(id)?;
    let t = light_task(v, id).await?;
    let mut con = v.con.clone();
    let g = shardctl_coordinator::failures::groups(&mut con, v.home, &t).await.map_err(failure)?;
    serde_json::to_value(g).map_err(|e| Reply::error(500, e))
}

async fn map(v: View<'_>, id: &str, query: &HashMap<String, String>) -> Result<Value, Reply> {
    let id = checked(id)?;
    let cells = number(query, "cells", shard_map::MAX_CELLS, 1..=shard_map::MAX_CELLS)?;
    let t = light_task(v, id).await?;
    let mut con = v.con.clone();
    let m = shard_map::shard_map(&mut con, v.home, &t, cells).await.map_err(failure)?;
    serde_json::to_value(m).map_err(|e| Reply::error(500, e))
}

async fn schedules(v: View<'_>) -> Result<Value, Reply> {
    let mut con = v.con.clone();
    let now = shardctl_common::time::server_now_ms(&mut con, v.home).await.map_err(failure)?;
    let all = schedule::list(&mut con, v.home, now).await.map_err(failure)?;
    Ok(Value::Array(all.iter().map(|(s, st)| crate::json::schedule(s, st)).collect()))
}

async fn events(v: View<'_>, query: &HashMap<String, String>) -> Result<Value, Reply> {
    let count = number(query, "count", 50, 1..=inspect::MAX_PAGE)?;
    let mut con = v.con.clone();
    let tail = shardctl_coordinator::events::newest(&mut con, v.home, count).await.map_err(failure)?;
    Ok(Value::Array(tail.iter().map(|(id, f)| crate::json::event(id, f)).collect()))
}
