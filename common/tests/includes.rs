//! Each script is built with the helpers it uses and no others: its header's `include:` line
//! names exactly the files of `lua/include/` that define a name its code uses (comments and
//! strings left out), and so does each include's. The registry resolves the rest
//! (`scripts::resolve`).

use std::collections::{BTreeMap, BTreeSet};

use shardctl_common::scripts::{included, resolve, scripts, INCLUDES};

fn source(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../lua/{file}", env!("CARGO_MANIFEST_DIR"))).expect("script source")
}

/// Lua code without its comments and with its strings emptied.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("--[[") {
            rest = r.split_once("]]").map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
            out.push('\n');
        } else if let Some(r) = rest.strip_prefix('\'') {
            rest = r.split_once('\'').map_or("", |(_, after)| after);
            out.push_str("''");
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The names each include file defines at its top level (`local function f`, `local X =`).
fn definitions() -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for (file, text) in INCLUDES {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("local ") else { continue };
            let rest = rest.strip_prefix("function ").unwrap_or(rest);
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(out.insert(name.clone(), *file).is_none(), "{name} is defined twice in lua/include/");
        }
    }
    out
}

/// The include files whose names `text` uses, less `own`.
fn used(text: &str, defs: &BTreeMap<String, &'static str>, own: Option<&str>) -> BTreeSet<String> {
    let code = code(text);
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let uses = |name: &str| {
        code.match_indices(name).any(|(i, _)| {
            let before = code[..i].chars().last();
            let after = code[i + name.len()..].chars().next();
            !before.is_some_and(|c| word(c) || c == '.') && !after.is_some_and(word)
        })
    };
    defs.iter().filter(|(n, f)| Some(**f) != own && uses(n)).map(|(_, f)| (*f).to_owned()).collect()
}

#[test]
fn every_header_names_exactly_the_includes_its_code_uses() {
    let defs = definitions();
    assert!(defs.contains_key("task_key") && defs.contains_key("now_ms"), "{defs:?}");
    let mut problems = Vec::new();
    let mut check = |what: String, text: &str, own: Option<&str>| {
        let named: BTreeSet<String> = included(text).into_iter().collect();
        let used = used(text, &defs, own);
        for n in used.difference(&named) {
            problems.push(format!("{what} uses a helper of {n}.lua, and its header does not include it"));
        }
        for n in named.difference(&used) {
            problems.push(format!("{what} includes {n}.lua and uses none of it"));
        }
    };
    for (file, text) in INCLUDES {
        check(format!("lua/include/{file}.lua"), text, Some(file));
    }
    for s in scripts().all() {
        check(format!("lua/{}", s.file()), &source(s.file()), None);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn scripts_are_built_with_their_includes_in_order_and_no_others() {
    let all = scripts().all();
    let none: Vec<&str> = all.iter().filter(|s| s.includes().is_empty()).map(|s| s.file()).collect();
    assert!(none.contains(&"ack.lua") && none.contains(&"lock_acquire.lua"), "{none:?}");
    for s in &all {
        let text = s.text();
        for (file, body) in INCLUDES {
            assert_eq!(text.contains(body), s.includes().contains(file), "{}: {file}", s.file());
        }
        // each include after those it includes
        for (i, file) in s.includes().iter().enumerate() {
            let body = INCLUDES.iter().find(|(n, _)| n == file).unwrap().1;
            for dep in included(body) {
                let at = s.includes().iter().position(|f| *f == dep).expect("resolved");
                assert!(at < i, "{}: {dep} after {file}", s.file());
            }
        }
    }
    let claim = all.iter().find(|s| s.file() == "claim.lua").unwrap();
    assert!(claim.includes().len() < INCLUDES.len(), "{:?}", claim.includes());
}

#[test]
fn an_unknown_include_is_refused() {
    assert!(resolve(&["nope".to_owned()]).unwrap_err().contains("no include is named 'nope'"));
    assert_eq!(included("--[[\n  x\n\n  include: task, lanes\n]]\nbody"), ["task", "lanes"]);
    assert!(included("local x = 1 -- include: task").is_empty());
    let lanes = resolve(&["lanes".to_owned()]).unwrap();
    assert_eq!(lanes.last(), Some(&"lanes"));
    assert!(lanes.contains(&"task"));
}
