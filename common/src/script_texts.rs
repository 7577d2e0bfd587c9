//! The text of every script this process may call, by its SHA1: what a `NOSCRIPT` reply is
//! answered with on a Redis Cluster ([`crate::conn::Conn`] sends the call again as `EVAL`, to
//! the node that refused it, which caches the script as it runs it). The scripts register
//! themselves as they are made; this module imports nothing of the crate.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

static TEXTS: LazyLock<RwLock<HashMap<String, &'static str>>> = LazyLock::new(Default::default);

/// Registers `text` (a script that lives as long as the process) under its SHA1 `hash`.
pub fn register(hash: &str, text: &'static str) {
    TEXTS.write().unwrap_or_else(|e| e.into_inner()).insert(hash.to_ascii_lowercase(), text);
}

/// The text of the script whose SHA1 is `hash`, if one was registered.
pub fn text(hash: &str) -> Option<&'static str> {
    TEXTS.read().unwrap_or_else(|e| e.into_inner()).get(&hash.to_ascii_lowercase()).copied()
}
