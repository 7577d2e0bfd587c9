//! Every key a script touches is declared (docs/design/declared-keys.md), checked against the
//! scripts' text: each header's `KEYS[i] name` lines against the body and the helpers of
//! `lua/include/` it calls (transitively), so that no declared key goes unused and no queue-level key is reached
//! but through `K`; and the one clock (no script takes a time from its caller). The run-time half
//! of the rule is the preamble's `K`, which raises on an undeclared name in every other test.

use std::collections::{BTreeMap, BTreeSet};

use shardctl_common::scripts::{key_ident, queue_key, scripts, KeyArgs, Lua, INCLUDES};
use shardctl_common::Home;

/// Every include file's text, one after the other.
fn lib() -> String {
    INCLUDES.iter().map(|(_, t)| format!("{t}\n")).collect()
}

/// Keys of a queue that exist once per queue: reached only through `K` (never built from the
/// prefix in Lua).
const QUEUE_LEVEL: &[&str] = &[
    "meta",
    "kinds",
    "tasks",
    "index",
    "wait",
    "delayed",
    "active",
    "stalled",
    "stalled-check",
    "decide-check",
    "speculating",
    "backups",
    "marker",
    "running",
    "finished",
    "events",
    "nodes",
    "routed-nodes",
    "reroute",
    "unrouted",
    "rebalance-lock",
    "rebalancing",
    "scheduled",
    "expiring",
    "limiter",
    "schedules",
    "schedule-state",
];

/// Scripts whose keys are not a queue's (locks, limiters): their callers name the keys.
const NOT_QUEUE: &[&str] = &[
    "lock_acquire.lua",
    "lock_extend.lua",
    "fence_raise.lua",
    "unlock.lua",
    "limit_fixed.lua",
    "limit_sliding.lua",
    "limit_bucket.lua",
];

fn source(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../lua/{file}", env!("CARGO_MANIFEST_DIR"))).expect("script source")
}

fn body(src: &str) -> &str {
    src.split_once("]]").map_or(src, |(_, b)| b)
}

/// `local function NAME(...)` ... `end` (at the start of a line) of the include files, by name.
fn lib_functions() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, String)> = None;
    for line in lib().lines() {
        if let Some(rest) = line.strip_prefix("local function ") {
            let name = rest.split('(').next().unwrap().to_owned();
            cur = Some((name, String::new()));
        } else if line == "end" {
            if let Some((n, b)) = cur.take() {
                out.insert(n, b);
            }
        } else if let Some((_, b)) = cur.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    out
}

fn calls(text: &str, name: &str) -> bool {
    text.match_indices(&format!("{name}(")).any(|(i, _)| {
        let before = text[..i].chars().last();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// What a text uses, with the lib functions it calls: `K.<name>` idents, and the suffixes of
/// `task_key(prefix, x, '<suffix>')` (the task's own keys).
fn uses(
    text: &str,
    lib: &BTreeMap<String, String>,
    seen: &mut BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut k = BTreeSet::new();
    let mut t = BTreeSet::new();
    for (i, _) in text.match_indices("K.") {
        if text[..i].chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = text[i + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        k.insert(name);
    }
    if text.contains("TASK_SUFFIXES") {
        // every key of the task (task_keys, touch_task without a list)
        t.extend(["", ":terminal", ":results", ":errors", ":keys", ":shards"].map(str::to_owned));
    }
    for (i, _) in text.match_indices("task_key(prefix, ") {
        let rest = &text[i..];
        let arg = rest.split(", ").nth(2).unwrap_or_default();
        if let Some(s) = arg.strip_prefix('\'') {
            t.insert(s.split('\'').next().unwrap().to_owned());
        }
    }
    for (f, b) in lib {
        if !seen.contains(f) && calls(text, f) {
            seen.insert(f.clone());
            let (k2, t2) = uses(b, lib, seen);
            k.extend(k2);
            t.extend(t2);
        }
    }
    (k, t)
}

#[test]
fn every_key_a_script_touches_is_declared_and_every_declared_key_is_used() {
    let lib = lib_functions();
    assert!(lib.contains_key("task_key") && lib.contains_key("end_task"), "includes parsed: {:?}", lib.keys());
    let mut problems = Vec::new();
    for s in scripts().all() {
        let src = source(s.file());
        let (k, t) = uses(body(&src), &lib, &mut BTreeSet::new());
        let mut declared: BTreeSet<String> = BTreeSet::new();
        let mut task_declared: BTreeSet<String> = BTreeSet::new();
        for name in s.declared() {
            let id = key_ident(name);
            assert!(declared.insert(id.clone()), "{}: {name} declared twice", s.file());
            if let Some(suffix) = name.strip_prefix("task:<id>") {
                task_declared.insert(suffix.to_owned());
            }
        }
        for u in k.difference(&declared) {
            problems.push(format!("{}: uses K.{u}, not declared", s.file()));
        }
        let single_task = task_declared.contains("");
        for d in &declared {
            // a single-task script reaches its task's keys through task_key (checked below)
            let via_task_key = single_task && d.starts_with("task") && d != "tasks";
            if !k.contains(d) && !via_task_key {
                problems.push(format!("{}: declares {d}, never uses it", s.file()));
            }
        }
        if single_task {
            // its task's keys reached through K count as used too
            let mut t = t;
            for u in k.iter().filter(|u| u.starts_with("task") && *u != "tasks") {
                t.insert(u.strip_prefix("task").unwrap().replace('_', ":"));
            }
            for u in t.difference(&task_declared) {
                problems.push(format!("{}: touches task:<id>{u} of its own task, not declared", s.file()));
            }
            for d in task_declared.difference(&t) {
                problems.push(format!("{}: declares task:<id>{d}, never uses it", s.file()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_queue_level_key_is_built_from_the_prefix_and_keys_are_reached_by_name() {
    let mut files: Vec<(String, String)> =
        INCLUDES.iter().map(|(n, t)| (format!("include/{n}.lua"), (*t).to_owned())).collect();
    for s in scripts().all() {
        files.push((s.file().to_owned(), source(s.file())));
    }
    for (file, src) in &files {
        let b = body(src);
        assert!(!b.contains("KEYS["), "{file}: reaches KEYS[i] by number, not through K");
        for q in QUEUE_LEVEL {
            assert!(!b.contains(&format!("prefix .. '{q}'")), "{file}: builds the queue key {q} from the prefix");
        }
    }
}

#[test]
fn every_queue_scripts_keys_are_built_by_the_registry() {
    let keys = Home::new("shardctl", "q").unwrap();
    let at = KeyArgs { task: Some("t"), node: Some("n"), source: Some("{shardctl:q}:reroute") };
    let queue: Vec<&Lua> = scripts().all().into_iter().filter(|s| !NOT_QUEUE.contains(&s.file())).collect();
    assert!(queue.len() >= 19, "{}", queue.len());
    for s in queue {
        assert!(!s.declared().is_empty(), "{} declares no key", s.file());
        for name in s.declared() {
            let k = queue_key(&keys, name, &at).unwrap_or_else(|e| panic!("{}: {e}", s.file()));
            assert!(k.starts_with("{shardctl:q}:"), "{}: {name} -> {k} is outside the queue's slot", s.file());
        }
    }
    for s in scripts().all().into_iter().filter(|s| NOT_QUEUE.contains(&s.file())) {
        assert!(!s.declared().is_empty(), "{} declares no key", s.file());
    }
}

#[test]
fn no_script_takes_a_time_from_its_caller() {
    for s in scripts().all() {
        let src = source(s.file());
        let header = src.split("]]").next().unwrap();
        for line in header.lines().filter(|l| l.trim_start().starts_with("ARGV[")) {
            // an instant by the caller's clock: `now_ms`, `now`, `start_ms`, `cutoff_ms`, `due_ms`
            let name = line.split_whitespace().nth(1).unwrap_or_default();
            let instant = ["now", "now_ms", "start_ms", "cutoff_ms", "due_ms", "created_ms"].contains(&name);
            assert!(!instant, "{}: takes the instant {name} from its caller: {line}", s.file());
        }
    }
    let clock = INCLUDES.iter().find(|(n, _)| *n == "clock").expect("clock.lua").1;
    assert!(clock.contains("local function now_ms()") && clock.contains("rcall('TIME')"));
}

#[test]
fn headers_number_their_keys_in_order() {
    use shardctl_common::scripts::declared_keys;
    assert_eq!(declared_keys("--[[\n  KEYS[1] wait list\n  KEYS[2] meta hash\n]]").unwrap(), ["wait", "meta"]);
    assert!(declared_keys("--[[\n  KEYS[1] wait\n  KEYS[3] meta\n]]").unwrap_err().contains("KEYS[3] follows KEYS[1]"));
    assert_eq!(key_ident("node:<n>:wait"), "node_wait");
    assert_eq!(key_ident("task:<id>"), "task");
    assert_eq!(key_ident("stalled-check"), "stalled_check");
}
