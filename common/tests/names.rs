//! Collision-free keys (issue 11, defect 4), proven by enumeration, without Redis.
//!
//! Every adversarial name of every kind is either refused by its rule in `names` (and by the
//! library constructors that take it), or it takes part in the enumeration: every `Keys` method
//! over every valid name of its kind, under several prefixes and queues, plus every lock's two
//! keys. No key string may belong to two entities, and every key of a queue must carry the
//! queue's hash tag `{P:Q}`. Members built from names (refs, tokens, schedule-state fields) must
//! be unique, parse back, and never start with another entity's `<name>:` (cancel, disown and
//! the heartbeat select by that prefix).
//!
//! A `Keys` method added later must be enumerated here too: `every_keys_method_is_enumerated`
//! reads `src/keys.rs` and fails for a method it does not know.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::lock::LockKeys;
use shardctl_common::model::ShardRef;
use shardctl_common::names::{self, Kind};
use shardctl_common::{schedule, Error, Home, Keys};

type QueueKey = fn(&Keys) -> String;
type NamedKey = fn(&Keys, &str) -> String;

/// Every key of the queue itself.
const QUEUE_KEYS: &[(&str, QueueKey)] = &[
    ("meta", Keys::meta),
    ("kinds", Keys::kinds),
    ("legacy_wait", Keys::legacy_wait),
    ("legacy_tasks", Keys::legacy_tasks),
    ("any_kind_marker", Keys::any_kind_marker),
    ("index", Keys::index),
    ("delayed", Keys::delayed),
    ("active", Keys::active),
    ("held", Keys::held),
    ("leases", Keys::leases),
    ("running", Keys::running),
    ("finished", Keys::finished),
    ("events", Keys::events),
    ("stalled", Keys::stalled),
    ("stalled_check", Keys::stalled_check),
    ("decide_check", Keys::decide_check),
    ("speculating", Keys::speculating),
    ("backups", Keys::backups),
    ("marker", Keys::marker),
    ("nodes", Keys::nodes),
    ("routed_nodes", Keys::routed_nodes),
    ("coordinators", Keys::coordinators),
    ("reroute", Keys::reroute),
    ("unrouted", Keys::unrouted),
    ("rebalance_lock", Keys::rebalance_lock),
    ("rebalancing", Keys::rebalancing),
    ("scheduled", Keys::scheduled),
    ("expiring", Keys::expiring),
    ("limiter", Keys::limiter),
    ("schedules", Keys::schedules),
    ("schedule_state", Keys::schedule_state),
    ("unreported", Keys::unreported),
    ("durable", Keys::durable),
];
/// Every key of one task, by task id (and `task_keys`, enumerated on its own).
const TASK_KEYS: &[(&str, NamedKey)] = &[
    ("task", Keys::task),
    ("terminal", Keys::terminal),
    ("results", Keys::results),
    ("errors", Keys::errors),
    ("shard_keys", Keys::shard_keys),
    ("shards", Keys::shards),
];
/// Every key of one node, by node id.
const NODE_KEYS: &[(&str, NamedKey)] =
    &[("node", Keys::node), ("node_wait", Keys::node_wait), ("node_marker", Keys::node_marker)];
/// Every key of one kind's lane, by kind.
const KIND_KEYS: &[(&str, NamedKey)] =
    &[("lane_wait", Keys::lane_wait), ("lane_tasks", Keys::lane_tasks), ("lane_marker", Keys::lane_marker)];
// No key is built from an executor instance (leases are members of `leases`) nor from a shard
// ref (per-shard state is a field of the task's `shards` hash).
/// `Keys` methods that build no key of their own.
const NOT_KEYS: &[&str] = &["new", "queue", "prefix", "tag", "task_keys"];

/// Incarnations (task `seq`) each task id is enumerated with.
const INCARNATIONS: &[u64] = &[1, 2, 10, 12, 123];
/// Shard indexes each task id is enumerated with (plus its aggregation job).
const INDEXES: &[u64] = &[0, 1, 9, 10, 11, 100, 4_294_967_295];

/// Names every kind must refuse: separators of hash tags, whitespace, control characters,
/// non-ASCII (lookalikes included), glob and member separators, empty, over 128 bytes.
fn refused_by_every_kind() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        "n{x}",
        "{x}",
        "x}",
        "{",
        "}",
        "{}",
        "a}:wait",
        "a b",
        " ",
        " a",
        "a ",
        "\t",
        "a\nb",
        "\0",
        "a\0",
        "\u{7f}",
        "é",
        "日本",
        "ｗａｉｔ",
        "wait\u{200b}",
        "A\u{301}",
        "a*",
        "a?",
        "[a]",
        "a|1",
        "a\\b",
        "a'b",
        "a\"b",
        "~pin",
        "a,b",
        "a;b",
        "a@b",
        "a#b",
        "a%b",
        "$",
        "a+b",
        "a=b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(129));
    v.push("a".repeat(10_000));
    v.push(format!("{}:", "x".repeat(200)));
    v
}

/// Names every kind but locks must refuse: they hold a key separator `:` or a `/`, or are
/// longer than 64 bytes. Lock names may hold them (see `names` for why they cannot collide).
fn refused_but_by_locks() -> Vec<String> {
    let mut v: Vec<String> = [
        "a:wait",
        "x:wait",
        "x:terminal",
        "x:results",
        "x:errors",
        "x:keys",
        "x:marker",
        "x:agg",
        "x:0",
        "x:1",
        "wait:x",
        "task:x",
        "node:x",
        "lease:x",
        "shard:x",
        ":",
        "::",
        "a:",
        ":a",
        "a::b",
        "a/b",
        "/",
        "lock:x",
        "p:lock:x",
        "p:lock",
        "a:fence",
        "shardctl:default",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(65));
    v.push("a".repeat(128));
    v
}

/// Valid-looking names chosen to collide if the rules let them: every word and suffix keys are
/// made of, one-character names, names that are prefixes of others, the longest names.
fn plausible() -> Vec<String> {
    let k = Home::new("p", "q").unwrap();
    let mut words: BTreeSet<String> = BTreeSet::new();
    let mut all: Vec<String> = QUEUE_KEYS.iter().map(|(_, f)| f(&k)).collect();
    for (_, f) in TASK_KEYS.iter().chain(NODE_KEYS).chain(KIND_KEYS) {
        all.push(f(&k, "t"));
    }
    all.extend(k.task_keys("t"));
    for key in all {
        let rest = key.strip_prefix(k.prefix()).unwrap().to_owned();
        words.extend(rest.split(':').map(str::to_owned));
        words.insert(rest);
    }
    for w in [
        "a", "b", "t", "x", "x.y", "x-y", "x_y", "xx", "x.", ".x", "-", "_", ".", "..", "...", "-x", "0", "1", "00",
        "01", "9", "10", "agg", "lock", "fence", "p", "q", "p.q", "p-lock", "default", "shardctl", "wait-x", "x-wait",
        "WAIT", "Wait", "tasks.", "task.x", "node.x", "1a", "a1",
    ] {
        words.insert(w.to_owned());
    }
    for n in [39, 40, 41, 63, 64] {
        words.insert("a".repeat(n));
        words.insert(format!("{}b", "a".repeat(n - 1)));
    }
    words.into_iter().collect()
}

fn candidates() -> Vec<String> {
    let mut v = plausible();
    v.extend(refused_by_every_kind());
    v.extend(refused_but_by_locks());
    v
}

fn valid(kind: Kind) -> Vec<String> {
    candidates().into_iter().filter(|n| kind.validate(n).is_ok()).collect::<BTreeSet<_>>().into_iter().collect()
}

#[test]
fn adversarial_names_are_refused_with_a_message_naming_the_kind() {
    for kind in Kind::ALL {
        let mut refused = refused_by_every_kind();
        if kind != Kind::Lock {
            refused.extend(refused_but_by_locks());
        }
        for name in &refused {
            match kind.validate(name) {
                Err(Error::Invalid(msg)) => {
                    assert!(msg.starts_with(kind.label()), "{kind:?} {name:?}: {msg}");
                    assert!(msg.contains(kind.allowed()), "{kind:?} {name:?}: {msg}");
                    assert!(msg.len() < 400, "{kind:?}: a message of {} bytes", msg.len());
                }
                other => panic!("{} {name:?} was not refused: {other:?}", kind.label()),
            }
        }
    }
    // the schedule rule is the task-id rule, shorter: its tasks are `<name>-YYYYMMDDTHHMMSSZ`
    assert!(Kind::Schedule.validate(&"a".repeat(41)).is_err());
    for name in valid(Kind::Schedule) {
        for fire_ms in [0, 253_402_300_799_000] {
            let id = schedule::task_id(&name, fire_ms);
            assert!(names::validate_task_id(&id).is_ok(), "schedule {name:?} fires task {id:?}");
        }
    }
    // a task id can never be the `active` pin
    assert!(names::validate_task_id(ACTIVE_PIN).is_err());
}

#[test]
fn library_constructors_refuse_what_the_rules_refuse() {
    for name in refused_by_every_kind().into_iter().chain(refused_but_by_locks()) {
        assert!(matches!(Home::new("shardctl", &name), Err(Error::Invalid(_))), "queue {name:?} accepted");
        assert!(matches!(Home::new(&name, "q"), Err(Error::Invalid(_))), "prefix {name:?} accepted");
        assert!(matches!(LockKeys::new(&name, "l"), Err(Error::Invalid(_))), "lock prefix {name:?} accepted");
    }
    for name in refused_by_every_kind() {
        assert!(matches!(LockKeys::new("shardctl", &name), Err(Error::Invalid(_))), "lock {name:?} accepted");
    }
    let e = Home::new("shardctl", "a:wait").unwrap_err().to_string();
    assert!(e.contains("queue name 'a:wait' has the character ':'"), "{e}");
}

/// The hash tag Redis Cluster hashes: between the first `{` and the first `}` after it, when
/// not empty; else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// Key → (owner, what). One owner may reach one key twice only through `task_keys`.
#[derive(Default)]
struct Registry {
    keys: HashMap<String, (String, String)>,
}

impl Registry {
    fn add(&mut self, key: String, owner: &str, what: &str) {
        match self.keys.entry(key) {
            Entry::Vacant(v) => {
                v.insert((owner.to_owned(), what.to_owned()));
            }
            Entry::Occupied(o) => {
                let (o_owner, o_what) = o.get();
                let same = o_owner == owner && (o_what == what || what == "task_keys");
                assert!(same, "collision: key {:?} is {o_owner} {o_what} and {owner} {what}", o.key());
            }
        }
    }
}

#[test]
fn no_two_entities_share_a_key_and_every_key_has_its_queues_tag() {
    let (tasks, nodes, locks) = (valid(Kind::TaskId), valid(Kind::NodeId), valid(Kind::Lock));
    let kinds = valid(Kind::TaskKind);
    assert!(tasks.len() > 50 && nodes.len() > 50 && locks.len() > tasks.len(), "too few names to prove anything");
    for n in ["wait", "terminal", "x", "x.y", "agg", "0", "node", "leases"] {
        assert!(tasks.contains(&n.to_owned()) && nodes.contains(&n.to_owned()), "{n} is not enumerated");
    }
    // the queues: plain, named like key words, prefixes of one another, at the length limit; and
    // every valid queue name under one prefix, every valid prefix over one queue
    let prefixes = ["shardctl", "p", "a", "a.b", "lock", "task", &"p".repeat(64)].map(str::to_owned);
    let queues = ["default", "q", "c", "b.c", "lock", "wait", "task", "node", "x", "x.y", &"q".repeat(64)];
    let mut combos: BTreeSet<(String, String)> = BTreeSet::new();
    for p in &prefixes {
        combos.extend(queues.iter().map(|q| (p.clone(), q.to_string())));
    }
    combos.extend(valid(Kind::Queue).into_iter().map(|q| ("shardctl".to_owned(), q)));
    combos.extend(valid(Kind::Prefix).into_iter().map(|p| (p, "default".to_owned())));
    let mut reg = Registry::default();
    // hash tag → whose slot it is: no queue shares one with another queue or a lock
    let mut slots: HashMap<String, String> = HashMap::new();
    let mut own_slot = |tag: String, owner: String| {
        if let Some(other) = slots.insert(tag.clone(), owner.clone()) {
            assert_eq!(other, owner, "hash tag {tag:?} is both {other}'s and {owner}'s");
        }
    };
    for (p, q) in &combos {
        let (p, q) = (p.as_str(), q.as_str());
        {
            let k = Home::new(p, q).unwrap();
            let tag = format!("{p}:{q}");
            let queue_owner = format!("queue {p:?}/{q:?}");
            let mut of_queue: Vec<String> = Vec::new();
            for (what, f) in QUEUE_KEYS {
                reg.add(f(&k), &queue_owner, what);
                of_queue.push(f(&k));
            }
            for t in &tasks {
                let owner = format!("{queue_owner} task {t:?}");
                for (what, f) in TASK_KEYS {
                    reg.add(f(&k, t), &owner, what);
                    of_queue.push(f(&k, t));
                }
                for key in k.task_keys(t) {
                    reg.add(key.clone(), &owner, "task_keys");
                    of_queue.push(key);
                }
            }
            for n in &nodes {
                let owner = format!("{queue_owner} node {n:?}");
                for (what, f) in NODE_KEYS {
                    reg.add(f(&k, n), &owner, what);
                    of_queue.push(f(&k, n));
                }
            }
            for kind in &kinds {
                let owner = format!("{queue_owner} kind {kind:?}");
                for (what, f) in KIND_KEYS {
                    reg.add(f(&k, kind), &owner, what);
                    of_queue.push(f(&k, kind));
                }
            }
            for key in &of_queue {
                assert!(key.starts_with(k.prefix()), "{key} is outside {}", k.prefix());
                assert_eq!(hash_tag(key), tag, "{key} is in another slot than queue {q} of {p}");
            }
            own_slot(tag, queue_owner.clone());
            // its partitions: the same names under a tag of their own, never another queue's
            for (pn, salt) in [(1, 0), (2, 0), (2, 7), (10, 123)] {
                let ptag = shardctl_common::partition::tag(p, q, pn, salt);
                let pk = k.partition(&ptag).unwrap();
                let owner = format!("{queue_owner} partition {pn}.{salt}");
                let mut of_part: Vec<String> = QUEUE_KEYS.iter().map(|(_, f)| f(&pk)).collect();
                for t in tasks.iter().take(20) {
                    of_part.extend(TASK_KEYS.iter().map(|(_, f)| f(&pk, t)));
                }
                for (i, key) in of_part.iter().enumerate() {
                    reg.add(key.clone(), &owner, &format!("partition key {i}"));
                    assert_eq!(hash_tag(key), ptag, "{key} is outside partition {ptag}");
                }
                own_slot(ptag, owner);
            }
        }
    }
    for p in prefixes.iter().cloned().chain(valid(Kind::Prefix)).collect::<BTreeSet<_>>() {
        let p = p.as_str();
        for l in &locks {
            let lk = LockKeys::new(p, l).unwrap();
            let owner = format!("lock {p:?}/{l:?}");
            assert_eq!(hash_tag(&lk.lock), format!("{p}:lock:{l}"), "{}", lk.lock);
            assert_eq!(hash_tag(&lk.fence), hash_tag(&lk.lock), "{} and its fence in two slots", lk.lock);
            own_slot(hash_tag(&lk.lock).to_owned(), owner.clone());
            reg.add(lk.lock, &owner, "lock");
            reg.add(lk.fence, &owner, "fence");
        }
    }
    eprintln!("{} distinct keys", reg.keys.len());
}

#[test]
fn members_made_of_names_are_unique_and_never_prefixed_by_another() {
    let tasks = valid(Kind::TaskId);
    let mut refs: HashMap<String, ShardRef> = HashMap::new();
    for t in &tasks {
        let all = INCARNATIONS.iter().flat_map(|&inc| {
            INDEXES.iter().map(move |&i| ShardRef::shard(t, inc, i)).chain([ShardRef::aggregate(t, inc)])
        });
        for r in all {
            let s = r.to_string();
            assert_ne!(s, ACTIVE_PIN);
            assert_eq!(s.parse::<ShardRef>().unwrap(), r, "{s} parses back to another ref");
            if let Some(other) = refs.insert(s.clone(), r.clone()) {
                panic!("ref {s} is both {other:?} and {r:?}");
            }
        }
    }
    // cancel.lua and clean select a task's refs by `<id>:`
    for (s, r) in &refs {
        for t in &tasks {
            assert_eq!(s.starts_with(&format!("{t}:")), &r.task == t, "ref {s} selected as task {t}'s");
        }
    }
    // tokens `<instance>:<seq>`: the heartbeat selects its own by `<instance>:`, the sweep takes
    // the instance as the text before the last `:`
    let instances = valid(Kind::Instance);
    let mut tokens = HashMap::new();
    for i in &instances {
        for seq in [0u64, 1, 10, 123_456_789] {
            let token = format!("{i}:{seq}");
            assert_eq!(token.rsplit_once(':').unwrap().0, i.as_str());
            assert!(tokens.insert(token.clone(), i.clone()).is_none(), "token {token} twice");
        }
    }
    for (token, owner) in &tokens {
        for i in &instances {
            assert_eq!(token.starts_with(&format!("{i}:")), owner == i, "token {token} selected as {i}'s");
        }
    }
    // schedule-state fields `<name>:last` and `<name>:task`
    let mut fields = HashMap::new();
    for name in valid(Kind::Schedule) {
        for f in ["last", "task"] {
            assert!(fields.insert(format!("{name}:{f}"), name.clone()).is_none(), "field {name}:{f} twice");
        }
    }
}

/// The public `Keys` methods listed in `src/keys.rs`.
fn keys_methods() -> BTreeSet<String> {
    let src = include_str!("../src/keys.rs");
    let start = src.find("impl Keys {").expect("impl Keys in keys.rs");
    let body = &src[start..start + src[start..].find("\n}\n").expect("end of impl Keys")];
    body.split("pub fn ")
        .skip(1)
        .map(|s| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect()
}

#[test]
fn every_keys_method_is_enumerated() {
    let known: BTreeSet<String> = QUEUE_KEYS
        .iter()
        .map(|(n, _)| *n)
        .chain(TASK_KEYS.iter().map(|(n, _)| *n))
        .chain(NODE_KEYS.iter().map(|(n, _)| *n))
        .chain(KIND_KEYS.iter().map(|(n, _)| *n))
        .chain(NOT_KEYS.iter().copied())
        .map(str::to_owned)
        .collect();
    let methods = keys_methods();
    assert!(methods.len() > 30, "keys.rs not parsed: {methods:?}");
    let missing: Vec<_> = methods.difference(&known).collect();
    assert!(missing.is_empty(), "Keys methods not enumerated by this test (add them to its lists): {missing:?}");
    let gone: Vec<_> = known.difference(&methods).collect();
    assert!(gone.is_empty(), "listed here but not in Keys: {gone:?}");
}
