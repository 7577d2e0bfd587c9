//! [`Dashboard`]: what a dashboard serves (its queue, its token, its read cache, the hosts it
//! answers) and [`read_token`].

use std::path::Path;

use shardctl_common::conn::Conn;
use shardctl_common::{Error, Home, Result};

/// A dashboard of one queue.
pub struct Dashboard {
    pub(super) con: Conn,
    pub(super) home: Home,
    /// The action token; `None`: read-only.
    pub(super) token: Option<String>,
    pub(super) reads: super::reads::Reads,
    /// The `Host` values answered (set when listening on loopback); `None`: any.
    pub(super) hosts: Option<Vec<String>>,
}

impl Dashboard {
    /// A dashboard reading `keys`' queue through `con`; actions need `token` (none: read-only).
    pub fn new(con: Conn, home: Home, token: Option<String>) -> Self {
        Dashboard { con, home, token, reads: super::reads::Reads::new(), hosts: None }
    }

    /// Whether actions are refused (no token configured).
    pub fn read_only(&self) -> bool {
        self.token.is_none()
    }
}

/// Reads the action token from `path`: its first line, at least 16 characters (a token that
/// short is guessable), printable ASCII.
pub fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("cannot read the token file {}: {e}", path.display())))?;
    let token = text.lines().next().map(str::trim).unwrap_or_default();
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(format!(
            "the token file {} must hold a token of at least 16 printable ASCII characters on its first line",
            path.display()
        )));
    }
    Ok(token.to_owned())
}
