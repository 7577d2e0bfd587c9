//! A cache of task metadata (kind, ranges, payload, backoff): read once per task per executor,
//! not once per shard. Entries are per incarnation (a task id dispatched again is another task,
//! see ARCHITECTURE.md "Identity"): a shard of a newer incarnation replaces the entry, one of
//! another incarnation than Redis holds gets nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::AsyncCommands;
use shardctl_common::backoff::Backoff;
use shardctl_common::conn::Conn;
use shardctl_common::model::TaskInfo;
use shardctl_common::{Keys, Result};

/// What an executor needs of a task.
#[derive(Debug)]
pub struct TaskMeta {
    /// The task as dispatched.
    pub info: TaskInfo,
    /// Its payload, shared by all its shards.
    pub payload: Arc<str>,
    /// Its retry backoff.
    pub backoff: Backoff,
}

/// Most tasks kept; past it the cache starts over (payloads may be large).
const MAX_TASKS: usize = 1024;

#[derive(Default)]
pub(crate) struct TaskCache {
    // std Mutex: held only to look up or insert, never across an await
    map: Mutex<HashMap<String, Arc<TaskMeta>>>,
}

impl TaskCache {
    /// The metadata of incarnation `inc` of task `id`, from the cache or Redis; `None` when the
    /// task is gone or Redis holds another incarnation under the id.
    pub(crate) async fn get(&self, con: &mut Conn, keys: &Keys, id: &str, inc: u64) -> Result<Option<Arc<TaskMeta>>> {
        if let Some(m) = self.map.lock().unwrap().get(id) {
            if m.info.seq == inc {
                return Ok(Some(m.clone()));
            }
        }
        let Some(meta) = load(con, keys, id).await? else {
            self.forget(id);
            return Ok(None);
        };
        if meta.info.seq != inc {
            // the id was dispatched again (or this shard is of an earlier incarnation): what is
            // cached under it is stale either way
            self.forget(id);
            return Ok(None);
        }
        let meta = Arc::new(meta);
        let mut map = self.map.lock().unwrap();
        if map.len() >= MAX_TASKS {
            map.clear();
        }
        map.insert(id.to_owned(), meta.clone());
        Ok(Some(meta))
    }

    pub(crate) fn cached(&self, id: &str, inc: u64) -> Option<Arc<TaskMeta>> {
        self.map.lock().unwrap().get(id).filter(|m| m.info.seq == inc).cloned()
    }

    pub(crate) fn forget(&self, id: &str) {
        self.map.lock().unwrap().remove(id);
    }

    /// Forgets every task: after Redis may have lost data, an incarnation number can repeat.
    pub(crate) fn clear(&self) {
        self.map.lock().unwrap().clear();
    }
}

/// Reads a task from Redis, uncached.
pub(crate) async fn load(con: &mut Conn, keys: &Keys, id: &str) -> Result<Option<TaskMeta>> {
    let h: HashMap<String, String> = con.hgetall(keys.task(id)).await?;
    let Some(info) = TaskInfo::from_hash(id, &h)? else { return Ok(None) };
    let backoff = info.backoff.parse().unwrap_or_default();
    let payload = Arc::from(info.payload.as_str());
    Ok(Some(TaskMeta { info, payload, backoff }))
}
