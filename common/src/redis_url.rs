//! Redis URLs as shardctl takes them: one server (`redis://`, `rediss://` for TLS, `unix://`,
//! with `user:password@` for an ACL user) or a cluster given by seed nodes
//! (`redis+cluster://[user:password@]host:port,host:port`, `rediss+cluster://` for TLS). Any
//! node of a cluster is enough as a seed; the others are found through `CLUSTER SLOTS`.
//! Passwords never leave this module unredacted: [`redact`] is what logs and errors show.

use crate::error::{Error, Result};

/// Where a URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server (or a proxy in front of several): the URL as given.
    Single(String),
    /// A Redis Cluster: one `redis://` or `rediss://` URL per seed node, credentials on each.
    Cluster(Vec<String>),
}

/// Reads a URL: a cluster scheme gives seed nodes, anything else is one server's URL.
pub fn parse(url: &str) -> Result<Target> {
    let bad = |why: &str| {
        Error::invalid(format!(
            "invalid redis URL '{}': {why} (a cluster is redis+cluster://[user:password@]host:port[,host:port...])",
            redact(url)
        ))
    };
    let (scheme, rest) = match url.split_once("://") {
        Some((s @ ("redis+cluster" | "rediss+cluster"), rest)) => (s.trim_end_matches("+cluster"), rest),
        _ => return Ok(Target::Single(url.to_owned())),
    };
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = hosts.trim_end_matches('/');
    if hosts.is_empty() {
        return Err(bad("no seed node"));
    }
    let mut nodes = Vec::new();
    for node in hosts.split(',') {
        let Some((host, port)) = node.rsplit_once(':') else {
            return Err(bad(&format!("seed node '{node}' is not host:port")));
        };
        if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad(&format!("seed node '{node}' is not host:port")));
        }
        nodes.push(format!("{scheme}://{auth}{host}:{port}"));
    }
    Ok(Target::Cluster(nodes))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_urls_pass_through() {
        for u in ["redis://127.0.0.1:6379", "rediss://u:p@h:1/0", "unix:///tmp/r.sock"] {
            assert_eq!(parse(u).unwrap(), Target::Single(u.to_owned()));
        }
    }

    #[test]
    fn cluster_urls_give_one_url_per_seed_with_the_credentials() {
        assert_eq!(
            parse("rediss+cluster://app:s3cret@a:7000,b:7001/").unwrap(),
            Target::Cluster(vec!["rediss://app:s3cret@a:7000".into(), "rediss://app:s3cret@b:7001".into()])
        );
        assert_eq!(parse("redis+cluster://a:1").unwrap(), Target::Cluster(vec!["redis://a:1".into()]));
    }

    #[test]
    fn malformed_cluster_urls_are_refused_without_the_password() {
        for u in [
            "redis+cluster://",
            "redis+cluster://u:pw@",
            "redis+cluster://u:pw@a",
            "redis+cluster://a:1,,b:2",
            "redis+cluster://a:x",
            "redis+cluster://a:0",
            "redis+cluster://:7000",
        ] {
            let e = parse(u).unwrap_err().to_string();
            assert!(e.contains("invalid redis URL") && !e.contains("pw"), "{u}: {e}");
        }
    }

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://u:pw@h:1"), "redis://u:***@h:1");
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis+cluster://u:p@w@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
