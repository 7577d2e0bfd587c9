//! A cache of task metadata (kind, ranges, payload, backoff): read once per task per executor,
//! not once per shard.

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
    /// The task's metadata, from the cache or Redis; `None` when the task is gone.
    pub(crate) async fn get(&self, con: &mut Conn, keys: &Keys, id: &str) -> Result<Option<Arc<TaskMeta>>> {
        if let Some(m) = self.map.lock().unwrap().get(id) {
            return Ok(Some(m.clone()));
        }
        let Some(meta) = load(con, keys, id).await? else { return Ok(None) };
        let meta = Arc::new(meta);
        let mut map = self.map.lock().unwrap();
        if map.len() >= MAX_TASKS {
            map.clear();
        }
        map.insert(id.to_owned(), meta.clone());
        Ok(Some(meta))
    }

    pub(crate) fn cached(&self, id: &str) -> Option<Arc<TaskMeta>> {
        self.map.lock().unwrap().get(id).cloned()
    }

    pub(crate) fn forget(&self, id: &str) {
        self.map.lock().unwrap().remove(id);
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
