//! Connecting to Redis. An [`Endpoint`] is where a queue's Redis is (opened from a URL, nothing
//! sent yet); a [`Conn`] is a connection to it: a manager that reconnects by itself for ordinary
//! commands, or a dedicated connection for blocking waits whose response timeout outlasts the
//! block. Every caller talks to a [`Conn`], so the kind of deployment behind it is decided here.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Value};

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

/// Where a queue's Redis is. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    client: Client,
    redacted: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Opens an endpoint for `url` (nothing is sent yet).
pub fn open(url: &str) -> Result<Endpoint> {
    let redacted = redact(url);
    let client = Client::open(url).map_err(|e| Error::invalid(format!("invalid redis URL '{redacted}': {e}")))?;
    Ok(Endpoint { client, redacted })
}

impl Endpoint {
    /// The URL with its password hidden.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// Connects a manager that reconnects with backoff whenever the connection drops.
    pub async fn manager(&self) -> Result<Conn> {
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let m = self.client.get_connection_manager_with_config(cfg).await.map_err(|e| self.unreachable(e))?;
        Ok(Conn::Managed(m))
    }

    /// A manager that connects on first use: a server down now still counts (Redlock's quorum).
    pub fn lazy(&self) -> Result<Conn> {
        let m = ConnectionManager::new_lazy_with_config(self.client.clone(), ConnectionManagerConfig::new())
            .map_err(|e| self.unreachable(e))?;
        Ok(Conn::Managed(m))
    }

    /// A connection of its own for a blocking command that waits up to `block`.
    pub async fn blocking(&self, block: Duration) -> Result<Conn> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(block + Duration::from_secs(5)));
        let c =
            self.client.get_multiplexed_async_connection_with_config(&cfg).await.map_err(|e| self.unreachable(e))?;
        Ok(Conn::Plain(c))
    }

    fn unreachable(&self, e: redis::RedisError) -> Error {
        let addr = self.client.get_connection_info().addr().to_string();
        Error::Unreachable(format!("cannot connect to redis at {addr}: {e}"))
    }
}

/// A connection to an [`Endpoint`]; clones share it.
#[derive(Clone)]
pub enum Conn {
    /// Reconnects by itself.
    Managed(ConnectionManager),
    /// One connection, for blocking waits.
    Plain(MultiplexedConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
        }
    }
}
