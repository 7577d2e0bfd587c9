//! Creating a task.

use redis::aio::ConnectionLike;

use crate::error::{Error, Result, ScriptCode};
use crate::keys::Keys;
use crate::model::TaskSpec;

use super::registry::*;

/// Creates a task (its times are the Redis server's). Fails with [`ScriptCode::TaskExists`](crate::ScriptCode::TaskExists)
/// when the id is taken.
pub async fn dispatch<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, spec: &TaskSpec) -> Result<()> {
    dispatch_fields(con, keys, spec, &spec.fields()).await
}

/// [`dispatch`] with the task hash's fields given (a partitioned task's home record and shares
/// add and change some of `spec.fields()`).
pub async fn dispatch_fields<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    spec: &TaskSpec,
    fields: &[(&str, String)],
) -> Result<()> {
    let mut inv = scripts().dispatch.keyed(keys, &KeyArgs { task: Some(&spec.id), ..Default::default() });
    inv.arg(keys.prefix()).arg(&spec.id).arg(spec.priority).arg(spec.delay.map_or(0, |d| d.as_millis() as u64));
    for (f, v) in fields {
        inv.arg(*f).arg(v);
    }
    let code: i64 = inv.invoke_async(con).await?;
    match ScriptCode::from_code(code) {
        None => Ok(()),
        Some(c) => Err(Error::Script(c)),
    }
}
