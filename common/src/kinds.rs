//! The kinds an executor serves (docs/design/lanes.md): its claims read only
//! those kinds' lanes, and its membership announces them. And the lanes, as readers see them.

use std::fmt;

use redis::aio::ConnectionLike;

use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::names::validate_kind;

/// The kinds of keyspace `keys` that may have a lane (`kinds`), sorted.
pub async fn lanes<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Vec<String>> {
    let mut v: Vec<String> = redis::cmd("SMEMBERS").arg(keys.kinds()).query_async(con).await?;
    v.sort();
    Ok(v)
}

/// The explicit refs waiting in every lane of keyspace `keys`, lane by lane (sorted by kind),
/// each head first.
pub async fn waiting<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Vec<String>> {
    let kinds = lanes(con, keys).await?;
    let mut pipe = redis::pipe();
    for k in &kinds {
        pipe.lrange(keys.lane_wait(k), 0, -1);
    }
    let lists: Vec<Vec<String>> = if kinds.is_empty() { Vec::new() } else { pipe.query_async(con).await? };
    Ok(lists.into_iter().flatten().collect())
}

/// Every kind, or a set of them (sorted, without repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// Every kind (`--kinds '*'`).
    Every,
    /// These kinds only.
    Only(Vec<String>),
}

impl Served {
    /// These kinds, each checked by [`validate_kind`]; at least one.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(kinds: I) -> Result<Self> {
        let mut v: Vec<String> = kinds.into_iter().map(Into::into).collect();
        for k in &v {
            validate_kind(k)?;
        }
        if v.is_empty() {
            return Err(Error::invalid("an executor must serve at least one kind"));
        }
        v.sort();
        v.dedup();
        Ok(Served::Only(v))
    }

    /// `*`, or kinds joined by commas (spaces around them allowed): what `--kinds` takes and
    /// what a membership record holds.
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s == "*" {
            return Ok(Served::Every);
        }
        let kinds: Vec<&str> = s.split(',').map(str::trim).collect();
        if kinds.contains(&"*") {
            return Err(Error::invalid("--kinds takes '*' alone (every kind) or a list of kinds, not both"));
        }
        if let Some(empty) = kinds.iter().position(|k| k.is_empty()) {
            return Err(Error::invalid(format!(
                "--kinds '{s}' has an empty kind at position {}; give kinds joined by commas, or '*' for every kind",
                empty + 1
            )));
        }
        Served::only(kinds)
    }

    /// Both together: every kind if either serves every kind.
    pub fn union(&self, other: &Served) -> Served {
        match (self, other) {
            (Served::Only(a), Served::Only(b)) => {
                let mut v = a.clone();
                v.extend(b.iter().cloned());
                v.sort();
                v.dedup();
                Served::Only(v)
            }
            _ => Served::Every,
        }
    }

    /// Whether `kind` is served.
    pub fn serves(&self, kind: &str) -> bool {
        match self {
            Served::Every => true,
            // a few kinds, in any order (`Only` may be built by hand)
            Served::Only(v) => v.iter().any(|k| k == kind),
        }
    }

    /// The kinds, or `None` for every kind.
    pub fn kinds(&self) -> Option<&[String]> {
        match self {
            Served::Every => None,
            Served::Only(v) => Some(v),
        }
    }
}

impl Default for Served {
    /// No kind at all (a registry before its first handler).
    fn default() -> Self {
        Served::Only(Vec::new())
    }
}

impl fmt::Display for Served {
    /// `*` or the kinds joined by commas (the claim's argument, the membership's field).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Served::Every => f.write_str("*"),
            Served::Only(v) => f.write_str(&v.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_a_list_or_every_kind_and_refuses_the_rest() {
        assert_eq!(Served::parse("*").unwrap(), Served::Every);
        let s = Served::parse(" report, primes ,report").unwrap();
        assert_eq!(s.to_string(), "primes,report");
        assert!(s.serves("report") && s.serves("primes") && !s.serves("prime"));
        for bad in ["", "a,,b", "a,*", "a b", "a:b", "x{y}", "é"] {
            assert!(Served::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Served::parse("a:b").unwrap_err().to_string().contains("kind 'a:b'"));
    }

    #[test]
    fn a_union_with_every_kind_is_every_kind() {
        let a = Served::parse("a").unwrap();
        assert_eq!(a.union(&Served::parse("b").unwrap()).to_string(), "a,b");
        assert_eq!(a.union(&Served::Every), Served::Every);
    }
}
