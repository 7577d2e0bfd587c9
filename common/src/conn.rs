//! Connecting to Redis: a [`ConnectionManager`] (reconnects by itself) for ordinary commands,
//! and a dedicated connection for blocking waits whose response timeout outlasts the block.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client};

use crate::error::{Error, Result};

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an ordinary command may take before it counts as failed.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A Redis URL with its password replaced by `***`, safe for logs and errors.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(p) => p,
        None => return url.to_owned(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

/// Opens a client for `url` (nothing is sent yet).
pub fn client(url: &str) -> Result<Client> {
    Client::open(url).map_err(|e| Error::invalid(format!("invalid redis URL '{}': {e}", redact(url))))
}

/// Connects a manager that reconnects with backoff whenever the connection drops.
pub async fn manager(client: &Client) -> Result<ConnectionManager> {
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(2));
    client.get_connection_manager_with_config(cfg).await.map_err(|e| unreachable_error(client, e))
}

/// A connection of its own for a blocking command that waits up to `block`.
pub async fn blocking(client: &Client, block: Duration) -> Result<MultiplexedConnection> {
    let cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(block + Duration::from_secs(5)));
    client.get_multiplexed_async_connection_with_config(&cfg).await.map_err(|e| unreachable_error(client, e))
}

fn unreachable_error(client: &Client, e: redis::RedisError) -> Error {
    let addr = client.get_connection_info().addr().to_string();
    Error::Unreachable(format!("cannot connect to redis at {addr}: {e}"))
}
