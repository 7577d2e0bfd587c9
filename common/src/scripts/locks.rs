//! Token locks: the compare-and-delete release.

use redis::aio::ConnectionLike;

use crate::error::Result;

use super::registry::*;

/// Deletes `key` if `token` still holds it; true when it did.
pub async fn unlock<C: ConnectionLike + Send>(con: &mut C, key: &str, token: &str) -> Result<bool> {
    let r: i64 = scripts().unlock.key(key).arg(token).invoke_async(con).await?;
    Ok(r == 1)
}
