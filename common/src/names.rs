//! The rules for every user-given name that becomes part of a Redis key or of a key's member:
//! one rule per kind, checked here and nowhere else, with a message that names the kind, the
//! offending character and the allowed set.
//!
//! # Why these rules make keys collision-free
//! Every key of queue `Q` under prefix `P` is `{P:Q}:` followed by a fixed word, optionally with
//! one name and a fixed suffix (`task:<id>:terminal`, `node:<n>:wait`). Key words and suffixes are separated by `:`. Names of every kind but
//! locks are 1 to 64 (schedules: 40) bytes of `A-Z a-z 0-9 . _ -`: no `:`, so a name can never
//! contain a separator and `node:x:wait` can only be node `x`'s list, never the hash of a node
//! `x:wait`; no `{` or `}`, so a name can never move a key to another hash tag (slot); no
//! spaces, control characters or non-ASCII, so a name prints as it is stored. Members built from
//! names (`<task>:<index>` refs, `<instance>:<seq>` tokens, `<schedule>:last`) split at their one
//! `:` the same way.
//!
//! Lock names keep a wider set (`: /` allowed, 1 to 128 bytes). They cannot collide: a lock's
//! keys are `{P:lock:NAME}` and `{P:lock:NAME}:fence`; a name has no `}`, so the name is exactly
//! the text between `{P:lock:` and the first `}`, and what follows that `}` (nothing, or `:fence`)
//! says which of the two keys it is. Queue keys cannot be lock keys either: their hash tag `P:Q`
//! has one `:` (neither a prefix nor a queue name has one), a lock's `P:lock:NAME` has two or more.
//! `common/tests/names.rs` checks all of this by enumeration over adversarial names.

use crate::error::{Error, Result};

/// Longest queue name, key prefix, task id, node id and executor instance id, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Longest task id, in bytes.
pub const MAX_TASK_ID_LEN: usize = MAX_NAME_LEN;
/// Longest schedule name: its task ids `<name>-YYYYMMDDTHHMMSSZ` stay within 64 bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 40;
/// Longest lock name, in bytes.
pub const MAX_LOCK_NAME_LEN: usize = 128;

/// The kinds of names, each with its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `--queue`: the `Q` of the hash tag `{P:Q}`.
    Queue,
    /// `--prefix`: the `P` of every key.
    Prefix,
    /// A task id (`task:<id>`, refs `<id>:<index>`).
    TaskId,
    /// An executor's node id (`node:<n>`, `node:<n>:wait`, members of `nodes`).
    NodeId,
    /// An executor process's instance id (its member of `leases`, tokens `<instance>:<seq>`).
    Instance,
    /// A schedule's name (fields of `schedules` and `schedule-state`, its task ids).
    Schedule,
    /// A lock's name (`{P:lock:NAME}`).
    Lock,
    /// A task's kind, the name of its handler (`kind:<k>:wait`, `kind:<k>:tasks`).
    TaskKind,
    /// A group of tasks that share fairly (fields `g:<group>` of `held`, `group_max:<group>`
    /// of `meta`).
    Group,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 9] = [
        Kind::Queue,
        Kind::Prefix,
        Kind::TaskId,
        Kind::NodeId,
        Kind::Instance,
        Kind::Schedule,
        Kind::Lock,
        Kind::TaskKind,
        Kind::Group,
    ];

    /// What the messages call it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Queue => "queue name",
            Kind::Prefix => "key prefix",
            Kind::TaskId => "task id",
            Kind::NodeId => "node id",
            Kind::Instance => "executor instance id",
            Kind::Schedule => "schedule name",
            Kind::Lock => "lock name",
            Kind::TaskKind => "kind",
            Kind::Group => "group",
        }
    }

    /// Longest name of this kind, in bytes.
    pub fn max_len(self) -> usize {
        match self {
            Kind::Schedule => MAX_SCHEDULE_NAME_LEN,
            Kind::Lock => MAX_LOCK_NAME_LEN,
            _ => MAX_NAME_LEN,
        }
    }

    /// The allowed characters, as the messages show them.
    pub fn allowed(self) -> &'static str {
        match self {
            Kind::Lock => "A-Z a-z 0-9 . _ : / -",
            _ => "A-Z a-z 0-9 . _ -",
        }
    }

    /// Whether `c` may appear in a name of this kind.
    pub fn allows(self, c: char) -> bool {
        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || (self == Kind::Lock && matches!(c, ':' | '/'))
    }

    /// Checks `name` against this kind's rule.
    pub fn validate(self, name: &str) -> Result<()> {
        let (label, max, allowed) = (self.label(), self.max_len(), self.allowed());
        if let Some((at, c)) = name.char_indices().find(|&(_, c)| !self.allows(c)) {
            return Err(Error::invalid(format!(
                "{label} '{}' has the character {c:?} at byte {at}; allowed are 1 to {max} bytes of {allowed}",
                shown(name)
            )));
        }
        if name.is_empty() || name.len() > max {
            return Err(Error::invalid(format!(
                "{label} must be 1 to {max} bytes, got {}; allowed are {allowed}",
                name.len()
            )));
        }
        Ok(())
    }
}

/// A name as a message shows it: escaped (no control characters reach a terminal) and cut after
/// 80 characters.
fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(80).flat_map(char::escape_debug).collect();
    if name.chars().nth(80).is_some() {
        s.push('…');
    }
    s
}

/// Checks a queue name: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_queue(name: &str) -> Result<()> {
    Kind::Queue.validate(name)
}

/// Checks a key prefix: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    Kind::Prefix.validate(prefix)
}

/// Checks a task id: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_task_id(id: &str) -> Result<()> {
    Kind::TaskId.validate(id)
}

/// Checks a task's kind: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_kind(kind: &str) -> Result<()> {
    Kind::TaskKind.validate(kind)
}

/// Checks a group name: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_group(group: &str) -> Result<()> {
    Kind::Group.validate(group)
}

/// Checks a node id: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_node_id(node: &str) -> Result<()> {
    Kind::NodeId.validate(node)
}

/// Checks an executor instance id: 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_instance(instance: &str) -> Result<()> {
    Kind::Instance.validate(instance)
}

/// Checks a schedule name: 1 to 40 bytes of `A-Z a-z 0-9 . _ -`.
pub fn validate_schedule_name(name: &str) -> Result<()> {
    Kind::Schedule.validate(name)
}

/// Checks a lock name: 1 to 128 bytes of `A-Z a-z 0-9 . _ : / -`.
pub fn validate_lock_name(name: &str) -> Result<()> {
    Kind::Lock.validate(name)
}

/// A valid node id made of `host` and `pid`: `<host>-<pid>`, where every character of the host
/// name outside the node-id set becomes `-` and the host part is cut so that the whole fits in
/// 64 bytes (`localhost` when nothing of the host name is left).
pub fn node_id_from_host(host: &str, pid: u32) -> String {
    let pid = pid.to_string();
    let room = MAX_NAME_LEN - 1 - pid.len();
    let mut host: String =
        host.trim().chars().map(|c| if Kind::NodeId.allows(c) { c } else { '-' }).take(room).collect();
    if host.is_empty() {
        host = "localhost".into();
    }
    format!("{host}-{pid}")
}

/// This machine's host name (`localhost` when it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A partition number or salt as written in a tag: decimal digits, no leading zero, < 2^32.
pub fn parse_number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_itself_the_character_and_the_set() {
        for kind in Kind::ALL {
            let e = kind.validate("a{b").unwrap_err().to_string();
            assert!(e.starts_with(kind.label()), "{e}");
            assert!(e.contains("the character '{' at byte 1"), "{e}");
            assert!(e.contains(kind.allowed()), "{e}");
            let e = kind.validate("").unwrap_err().to_string();
            assert!(e.contains(&format!("{} must be 1 to {} bytes, got 0", kind.label(), kind.max_len())), "{e}");
            assert!(kind.validate(&"a".repeat(kind.max_len())).is_ok());
            let e = kind.validate(&"a".repeat(kind.max_len() + 1)).unwrap_err().to_string();
            assert!(e.contains(&format!("got {}", kind.max_len() + 1)), "{e}");
            assert!(kind.validate("Az09._-").is_ok());
        }
        assert!(validate_lock_name("jobs/nightly:db").is_ok());
        assert!(validate_node_id("a:wait").is_err());
        assert!(validate_node_id("a/b").is_err());
    }

    #[test]
    fn messages_escape_and_shorten_names() {
        let e = validate_node_id("a\nb").unwrap_err().to_string();
        assert!(e.contains("'a\\nb' has the character '\\n' at byte 1"), "{e}");
        let e = validate_task_id(&format!("{}:", "x".repeat(10_000))).unwrap_err().to_string();
        assert!(e.len() < 300 && e.contains("…") && e.contains("':' at byte 10000"), "{e}");
        let e = validate_queue("é").unwrap_err().to_string();
        assert!(e.contains("'é' at byte 0"), "{e}");
    }

    #[test]
    fn node_ids_from_any_host_name_are_valid() {
        assert_eq!(node_id_from_host("web-1.example.com", 42), "web-1.example.com-42");
        assert_eq!(node_id_from_host("a:b{c} d", 7), "a-b-c--d-7");
        assert_eq!(node_id_from_host("", 7), "localhost-7");
        assert_eq!(node_id_from_host("hôte", 7), "h-te-7");
        let long = node_id_from_host(&"h".repeat(300), u32::MAX);
        assert_eq!(long.len(), MAX_NAME_LEN);
        for host in ["", " ", "日本", "a:wait", "{x}", &"é".repeat(100), "x\ny"] {
            for pid in [0, 1, 4_194_304, u32::MAX] {
                let id = node_id_from_host(host, pid);
                assert!(validate_node_id(&id).is_ok(), "{host:?} {pid}: {id}");
            }
        }
    }
}
