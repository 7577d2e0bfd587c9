//! Dispatch of a pull task: validate, then one script call that stores the task hash and puts
//! the task in the runnable set. O(1) in time and Redis memory whatever the shard count.

use redis::aio::ConnectionLike;
use shardctl_common::model::TaskSpec;
use shardctl_common::time::now_ms;
use shardctl_common::{scripts, Error, Keys, Result, ScriptCode};

/// A fresh task id: time-ordered and unique enough across coordinators.
pub fn new_task_id() -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    format!("t{}-{}", now_ms(), &u[..8])
}

/// Validates `spec` and creates the task. An id already in use is refused with a clear error.
pub async fn dispatch<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, spec: &TaskSpec) -> Result<()> {
    spec.validate()?;
    match scripts::dispatch(con, keys, spec, now_ms()).await {
        Err(Error::Script(ScriptCode::TaskExists)) => {
            Err(Error::invalid(format!("a task with id '{}' already exists in this queue", spec.id)))
        }
        other => other,
    }
}
