//! The JSON shapes shared by the CLI's `--json` outputs and the dashboard's API (documented by
//! the schemas in docs/schemas): fields stored as text in Redis given their JSON types, an event
//! of the log, a schedule with its progress, a queue's settings.

use serde_json::{json, Map, Value};
use shardctl_common::control::QueueSettings;
use shardctl_common::partition::Layout;
use shardctl_common::schedule::{Schedule, ScheduleState};
use shardctl_common::share::Stored;

/// A field stored as text in Redis, as JSON of its type: the counts, sizes, times and ids that
/// are numbers become numbers, the 0/1 flags booleans, the payload the JSON it holds, anything
/// else a string. Every `--json` output goes through this, so a script gets JSON types.
pub fn field(key: &str, value: &str) -> serde_json::Value {
    const NUMBERS: &[&str] = &[
        "seq",
        "total",
        "done",
        "failed",
        "items",
        "vnodes",
        "shard_timeout_ms",
        "attempts",
        "priority",
        "weight",
        "max_running",
        "max_failures",
        "success_when",
        "cancelled",
        "running_ms",
        "threshold_ms",
        "retain_ms",
        "recovered",
        "shard",
        "partition",
        "round",
        "cursor",
        "routed",
        "start_ms",
        "created_ms",
        "finished_ms",
        "count",
        "max",
        "per_ms",
        "attempt",
        "shards",
        "fire_ms",
        "due_ms",
        "stopped",
    ];
    const FLAGS: &[&str] = &["has_keys", "keep_results"];
    if NUMBERS.contains(&key) {
        if let Ok(n) = value.parse::<i64>() {
            return n.into();
        }
    }
    if FLAGS.contains(&key) && (value == "0" || value == "1") {
        return (value == "1").into();
    }
    if key == "payload" {
        if let Ok(v) = serde_json::from_str(value) {
            return v;
        }
    }
    value.into()
}

/// One event of the log (`watch --json`, the dashboard): its id, its time (ms, from the id) and
/// its fields, typed.
pub fn event(id: &str, fields: &[(String, String)]) -> Value {
    let ms: u64 = id.split('-').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    let mut o = Map::new();
    o.insert("id".into(), id.into());
    o.insert("time_ms".into(), ms.into());
    for (k, v) in fields {
        o.insert(k.clone(), field(k, v));
    }
    Value::Object(o)
}

/// A schedule with its progress (`schedule list --json`, the dashboard): the task's fields as an
/// object of JSON types, not a list of text pairs.
pub fn schedule(s: &Schedule, st: &ScheduleState) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or_else(|_| json!({}));
    let fields: Map<String, Value> = s.fields.iter().map(|(k, f)| (k.clone(), field(k, f))).collect();
    v["fields"] = Value::Object(fields);
    v["state"] = serde_json::to_value(st).unwrap_or(Value::Null);
    v
}

/// A queue's settings (`shardctl config --json`).
pub fn settings(queue: &str, s: &QueueSettings, layout: &Layout, masters: Option<&[String]>) -> Value {
    let tags: Vec<&str> = layout.partitions.iter().map(|p| p.tag()).collect();
    json!({
        "queue": queue,
        "events_maxlen": s.events_maxlen,
        "events_completions": s.events_completions,
        "paused": s.paused,
        "durability": s.durability.mode.as_str(),
        "durability_timeout_ms": s.durability.timeout.as_millis() as u64,
        "partitions": layout.count(),
        "partition_tags": tags,
        "partition_masters": masters,
        "groups": s.groups.iter().map(|(name, g)| (name.clone(), json!({ "weight": g.weight, "max_running": g.max_running }))).collect::<serde_json::Map<_, _>>(),
    })
}

/// One shard's stored outcome as a JSON line of `shardctl results` (`None`: nothing to show, a
/// result dropped at the task's end). A stored result is JSON text already: written as it is.
pub fn outcome(index: u64, o: &Stored, dropped: bool) -> Option<String> {
    match o {
        Stored::Result(Some(r)) => Some(format!("{{\"shard\":{index},\"result\":{r}}}")),
        Stored::Result(None) if dropped => None,
        Stored::Result(None) => Some(format!("{{\"shard\":{index},\"result\":null}}")),
        Stored::Error(e) => Some(format!("{{\"shard\":{index},\"error\":{}}}", Value::from(e.as_str()))),
    }
}

/// A task's failed shards with their reasons (`status --failed --json`).
pub fn failed(failed: &[(u64, String)]) -> Value {
    failed.iter().map(|(i, r)| json!({ "shard": i, "reason": r })).collect()
}
