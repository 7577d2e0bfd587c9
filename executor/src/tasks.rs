//! A cache of task metadata (kind, ranges, payload, backoff): read once per task per executor,
//! not once per shard. Entries are per incarnation, compared by the full incarnation id the claim
//! handed out with the shard (`inc`, which no rollback of a slot reissues, unlike the `seq` in
//! the ref; docs/design/identity.md): a shard of another incarnation replaces the entry, one
//! of another incarnation than Redis holds gets nothing.

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
    /// The metadata of incarnation (`seq`, `inc`: the ref's and the claim's) of task `id`, from
    /// the cache or Redis; `None` when the task is gone or Redis holds another incarnation under
    /// the id.
    pub(crate) async fn get(
        &self,
        con: &mut Conn,
        keys: &Keys,
        id: &str,
        seq: u64,
        inc: &str,
    ) -> Result<Option<Arc<TaskMeta>>> {
        if let Some(m) = self.cached(id, seq, inc) {
            return Ok(Some(m));
        }
        let Some(meta) = load(con, keys, id).await? else {
            self.forget(id);
            return Ok(None);
        };
        if !is(&meta, seq, inc) {
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

    /// The cached metadata of incarnation (`seq`, `inc`) of task `id`, if any.
    pub(crate) fn cached(&self, id: &str, seq: u64, inc: &str) -> Option<Arc<TaskMeta>> {
        self.map.lock().unwrap().get(id).filter(|m| is(m, seq, inc)).cloned()
    }

    pub(crate) fn forget(&self, id: &str) {
        self.map.lock().unwrap().remove(id);
    }

    /// Forgets every task: after Redis may have lost data, an incarnation number can repeat.
    pub(crate) fn clear(&self) {
        self.map.lock().unwrap().clear();
    }
}

/// Whether `m` is incarnation (`seq`, `inc`): the full id when the claim gave one (empty: a
/// record written before records had one, known by its seq alone).
fn is(m: &TaskMeta, seq: u64, inc: &str) -> bool {
    m.info.seq == seq && (inc.is_empty() || m.info.inc == inc)
}

/// Reads a task from Redis, uncached.
pub(crate) async fn load(con: &mut Conn, keys: &Keys, id: &str) -> Result<Option<TaskMeta>> {
    let h: HashMap<String, String> = con.hgetall(keys.task(id)).await?;
    let Some(info) = TaskInfo::from_hash(id, &h)? else { return Ok(None) };
    let backoff = info.backoff.parse().unwrap_or_default();
    let payload = Arc::from(info.payload.as_str());
    Ok(Some(TaskMeta { info, payload, backoff }))
}

#[cfg(test)]
mod tests {
    use shardctl_common::model::TaskSpec;
    use shardctl_common::{scripts, Keys};
    use shardctl_testkit::TestRedis;

    use super::*;

    /// A failover to a lagging replica takes back a dispatch and its `meta.seq`: the next
    /// dispatch of the id gets the same seq, with another payload. A cache that kept the first
    /// spec (no call of this executor failed) must not run the second dispatch's shards with it.
    #[tokio::test]
    async fn a_seq_a_rollback_gives_out_again_never_serves_the_cached_spec() {
        let redis = TestRedis::start();
        let mut con = shardctl_common::conn::open(&redis.url()).unwrap().manager().await.unwrap();
        let keys = Keys::new("shardctl", "cache").unwrap();
        let first = TaskSpec { payload: r#"{"v":1}"#.into(), ..TaskSpec::new("t", "noop", 2) };
        scripts::dispatch(&mut con, &keys, &first).await.unwrap();
        let (seq, inc_a): (u64, String) =
            redis::cmd("HMGET").arg(keys.task("t")).arg("seq").arg("inc").query_async(&mut con).await.unwrap();
        let cache = TaskCache::default();
        let m = cache.get(&mut con, &keys, "t", seq, &inc_a).await.unwrap().unwrap();
        assert_eq!(&*m.payload, r#"{"v":1}"#);

        // the rollback: the record and the counter go back; the id is dispatched again
        let () = redis::cmd("DEL").arg(keys.task("t")).query_async(&mut con).await.unwrap();
        let () = redis::cmd("HSET").arg(keys.meta()).arg("seq").arg(seq - 1).query_async(&mut con).await.unwrap();
        let second = TaskSpec { payload: r#"{"v":2}"#.into(), ..TaskSpec::new("t", "noop", 2) };
        scripts::dispatch(&mut con, &keys, &second).await.unwrap();
        let (seq_b, inc_b): (u64, String) =
            redis::cmd("HMGET").arg(keys.task("t")).arg("seq").arg("inc").query_async(&mut con).await.unwrap();
        assert_eq!(seq_b, seq, "the rollback gave the seq out again");
        assert_ne!(inc_b, inc_a, "but never the incarnation id");

        let m = cache.get(&mut con, &keys, "t", seq, &inc_b).await.unwrap().unwrap();
        assert_eq!(&*m.payload, r#"{"v":2}"#, "a shard of the second dispatch runs with its own spec");
        assert!(cache.cached("t", seq, &inc_a).is_none());
        // a late shard of the first dispatch gets nothing (its record is gone)
        assert!(cache.get(&mut con, &keys, "t", seq, &inc_a).await.unwrap().is_none());
    }
}
