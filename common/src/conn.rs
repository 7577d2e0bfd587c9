//! Connecting to Redis. An [`Endpoint`] is where a queue's Redis is (opened from a URL, nothing
//! sent yet); a [`Conn`] is a connection to it: a manager that reconnects by itself for ordinary
//! commands, or a dedicated connection for blocking waits whose response timeout outlasts the
//! block. Every caller talks to a [`Conn`], so the kind of deployment behind it is decided here:
//! one server (plain or TLS, any ACL user) or a Redis Cluster, where a queue's keys share one slot
//! and the cluster connection routes every command and script to that slot's master.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::redis_url;

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an ordinary command may take before it counts as failed.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::redis_url::redact;

/// Where a queue's Redis is. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    target: Target,
    redacted: String,
}

// a process holds a handful of endpoints: the size of the larger variant costs nothing
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Target {
    Single(Client),
    // the seed nodes make the blocking connection's client, which has timeouts of its own
    Cluster(ClusterClient, Vec<String>),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// The Redis URL held on the first line of a file (so that a password stays out of the process
/// list: `--redis-url-file`). An unreadable file, or one with no URL, is bad input; the error
/// names the file, never its content.
pub fn url_from_file(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("cannot read --redis-url-file {}: {e}", path.display())))?;
    match text.lines().next().map(str::trim).filter(|l| !l.is_empty()) {
        Some(url) => Ok(url.to_owned()),
        None => Err(Error::invalid(format!("--redis-url-file {} holds no URL on its first line", path.display()))),
    }
}

/// Opens an endpoint for `url`, one server or a `redis+cluster://` list of seed nodes (see
/// [`crate::redis_url`]). Nothing is sent yet.
pub fn open(url: &str) -> Result<Endpoint> {
    let redacted = redact(url);
    let invalid = |e: redis::RedisError| Error::invalid(format!("invalid redis URL '{redacted}': {e}"));
    let client = match redis_url::parse(url)? {
        redis_url::Target::Single(url) => Target::Single(Client::open(url).map_err(invalid)?),
        redis_url::Target::Cluster(nodes) => {
            Target::Cluster(cluster_client(nodes.clone(), RESPONSE_TIMEOUT).map_err(invalid)?, nodes)
        }
    };
    Ok(Endpoint { target: client, redacted })
}

fn cluster_client(nodes: Vec<String>, response_timeout: Duration) -> redis::RedisResult<ClusterClient> {
    // the overall timeout bounds a call with its MOVED/ASK redirections and the retries while a
    // failover elects a new master (a few seconds with cluster-node-timeout 5 s)
    ClusterClient::builder(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        .overall_response_timeout(Some(response_timeout + Duration::from_secs(10)))
        .build()
}

impl Endpoint {
    /// The URL with its password hidden.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// True for a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(..))
    }

    /// Connects a manager that reconnects with backoff whenever the connection drops. For a
    /// cluster: a cluster connection, which reconnects by itself, follows MOVED/ASK and refreshes
    /// its slot map after a resharding or a failover.
    pub async fn manager(&self) -> Result<Conn> {
        match &self.target {
            Target::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(2));
                let m = client.get_connection_manager_with_config(cfg).await.map_err(|e| self.unreachable(e))?;
                Ok(self.conn(Link::Managed(m)))
            }
            Target::Cluster(client, _) => {
                Ok(self.conn(Link::Cluster(client.get_async_connection().await.map_err(|e| self.unreachable(e))?)))
            }
        }
    }

    /// A manager that connects on first use: a server down now still counts (Redlock's quorum).
    /// Redlock wants independent servers, so a cluster is refused.
    pub fn lazy(&self) -> Result<Conn> {
        let Target::Single(client) = &self.target else {
            return Err(Error::invalid(format!(
                "'{}' is a cluster; Redlock takes independent single servers",
                self.redacted
            )));
        };
        let m = ConnectionManager::new_lazy_with_config(client.clone(), ConnectionManagerConfig::new())
            .map_err(|e| self.unreachable(e))?;
        Ok(self.conn(Link::Managed(m)))
    }

    fn conn(&self, link: Link) -> Conn {
        Conn { link, endpoint: std::sync::Arc::new(self.clone()) }
    }

    /// A connection of its own for a blocking command that waits up to `block`. For a cluster:
    /// a cluster connection of its own (the blocking command goes to the node owning its keys),
    /// so a wait never holds up the ordinary commands of the manager.
    pub async fn blocking(&self, block: Duration) -> Result<Conn> {
        let timeout = block + Duration::from_secs(5);
        match &self.target {
            Target::Single(client) => {
                let cfg = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(timeout));
                let c =
                    client.get_multiplexed_async_connection_with_config(&cfg).await.map_err(|e| self.unreachable(e))?;
                Ok(self.conn(Link::Plain(c)))
            }
            Target::Cluster(_, nodes) => {
                let client = cluster_client(nodes.clone(), timeout).map_err(|e| self.unreachable(e))?;
                let c = client.get_async_connection().await.map_err(|e| self.unreachable(e))?;
                Ok(self.conn(Link::Cluster(c)))
            }
        }
    }

    fn unreachable(&self, e: redis::RedisError) -> Error {
        let what = match &self.target {
            Target::Single(client) => {
                let addr = client.get_connection_info().addr().to_string();
                // with credentials, say whose (the password hidden): a wrong user is a common slip
                if self.redacted.contains('@') {
                    format!("redis at {addr} ({})", self.redacted)
                } else {
                    format!("redis at {addr}")
                }
            }
            Target::Cluster(..) => format!("redis cluster {}", self.redacted),
        };
        // a server's reply never holds the password; the URL is only ever shown redacted
        Error::Unreachable(format!("cannot connect to {what}: {e}"))
    }
}

/// `EVALSHA sha …` as `EVAL text …`, when the script's text is known ([`crate::script_texts`]).
///
/// On a Redis Cluster a `NOSCRIPT` is answered so, on the connection that routed the call: the
/// node that refused it (its slot's master) runs the script and caches it. The client's own way,
/// `SCRIPT LOAD` and a second `EVALSHA`, sends the load to every node of the cluster, replicas
/// included, and waits for all of them: one frozen replica that serves none of the queue's keys
/// would hold every first call of a script up for the response timeout.
fn eval_of(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => Some(b),
        _ => None,
    });
    let name = args.next()??;
    if !name.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let text = crate::script_texts::text(std::str::from_utf8(args.next()??).ok()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(text);
    for a in args {
        eval.arg(a?);
    }
    Some(eval)
}

/// A connection to an [`Endpoint`]; clones share it. It knows its endpoint, so that a caller
/// holding only a connection can open one of its own for a blocking command ([`Conn::dedicated`]).
#[derive(Clone)]
pub struct Conn {
    link: Link,
    endpoint: std::sync::Arc<Endpoint>,
}

#[derive(Clone)]
enum Link {
    /// Reconnects by itself.
    Managed(ConnectionManager),
    /// One connection, for blocking waits.
    Plain(MultiplexedConnection),
    /// A Redis Cluster: routes each command by its keys' slot, follows MOVED/ASK.
    Cluster(ClusterConnection),
}

impl Conn {
    /// True for a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// A connection of its own to the same endpoint, for a blocking command that waits up to
    /// `block` ([`Endpoint::blocking`]).
    pub async fn dedicated(&self, block: Duration) -> Result<Conn> {
        self.endpoint.blocking(block).await
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.link {
            Link::Managed(c) => c.req_packed_command(cmd),
            Link::Plain(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => Box::pin(async move {
                match c.req_packed_command(cmd).await {
                    // a server's error comes back as a value; `query_async` makes it an error
                    Ok(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript) => match eval_of(cmd) {
                        Some(eval) => c.req_packed_command(&eval).await,
                        None => Ok(Value::ServerError(e)),
                    },
                    r => r,
                }
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.link {
            Link::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Managed(c) => c.get_db(),
            Link::Plain(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}
