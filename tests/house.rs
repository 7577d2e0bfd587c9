//! The house rules of the tree, checked on its sources (no Redis):
//! - no import circle between the files of a crate: each file is a module, a path from one to
//!   another (`use crate::a::b`, `super::x`, `child::y` in code or in `use`) is an edge, and the
//!   graph must have no cycle (a child's `use super::X` and the parent's `child::f` make one: the
//!   shared thing belongs in a file of its own, low, that both import);
//! - no production source file (a crate's `src/`, `lua/`) over 400 lines.
//!
//! The parse is a tokenizer, not a Rust parser: comments, strings and characters are skipped,
//! paths are read as `seg (:: (seg | {tree, ...}))*`, and a file's `#[cfg(test)]` tail (its unit
//! tests, whose `super` is the file itself) is left out of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MAX_LINES: usize = 400;

/// Files still over [`MAX_LINES`], each with the length it may not pass while it waits to be
/// split (issue 25): the list only shrinks.
const LONG_FOR_NOW: &[(&str, usize)] = &[];

/// The crates: their root files (the `shardctl` package has two: the library and the binary).
const CRATES: &[&str] = &[
    "common/src/lib.rs",
    "coordinator/src/lib.rs",
    "executor/src/lib.rs",
    "testkit/src/lib.rs",
    "bench/src/lib.rs",
    "src/lib.rs",
    "src/main.rs",
];

/// One module of a crate: its path from the crate root and its file.
#[derive(Debug, Clone)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

#[derive(Debug, PartialEq, Clone)]
enum Tok {
    Ident(String),
    Sep, // ::
    Open,
    Close,
    Comma,
    Semi,
    Other,
}

/// The tokens of `src` that paths are made of; comments, strings and chars are dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // a raw string r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(Tok::Ident("r".into()));
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push(Tok::Other);
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Other);
        } else if c == b'\'' {
            // a char literal ('a', '\n', '\u{1F}') or a lifetime ('a)
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
            }
            out.push(Tok::Other);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_owned()));
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Tok::Sep);
            i += 2;
        } else {
            out.push(match c {
                b'{' => Tok::Open,
                b'}' => Tok::Close,
                b',' => Tok::Comma,
                b';' => Tok::Semi,
                _ if c.is_ascii_whitespace() => {
                    i += 1;
                    continue;
                }
                _ => Tok::Other,
            });
            i += 1;
        }
    }
    out
}

/// Reads a path tree at `toks[*i]` (an identifier followed by `::`), returning every path it
/// spells out (`a::{b, c::d}` → `a::b`, `a::c::d`) and leaving `*i` after it.
fn path_tree(toks: &[Tok], i: &mut usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                *i += 1;
            }
            Some(Tok::Open) => {
                *i += 1;
                let mut all = Vec::new();
                loop {
                    match toks.get(*i) {
                        Some(Tok::Close) => {
                            *i += 1;
                            break;
                        }
                        Some(Tok::Comma) => *i += 1,
                        Some(Tok::Ident(_)) | Some(Tok::Open) => {
                            for p in path_tree(toks, i) {
                                all.push(prefix.iter().cloned().chain(p).collect());
                            }
                        }
                        None => break,
                        _ => *i += 1,
                    }
                }
                return all;
            }
            _ => return vec![prefix],
        }
        if toks.get(*i) == Some(&Tok::Sep) {
            *i += 1;
        } else {
            return vec![prefix];
        }
    }
}

/// `src` without its `#[cfg(test)]` tail.
fn production(src: &str) -> &str {
    match src.find("#[cfg(test)]") {
        Some(at) => &src[..at],
        None => src,
    }
}

/// The modules of the crate whose root file is `root`, found through its `mod x;` lines.
fn modules(root: &Path) -> Vec<Module> {
    let mut all = Vec::new();
    let mut todo = vec![Module { path: Vec::new(), file: root.to_owned() }];
    while let Some(m) = todo.pop() {
        let src = std::fs::read_to_string(&m.file).unwrap_or_else(|e| panic!("{}: {e}", m.file.display()));
        let toks = tokens(production(&src));
        let name = m.file.file_name().unwrap().to_str().unwrap();
        let dir = if m.path.is_empty() || name == "mod.rs" {
            m.file.parent().unwrap().to_owned()
        } else {
            m.file.with_extension("")
        };
        for w in toks.windows(3) {
            if let [Tok::Ident(kw), Tok::Ident(child), Tok::Semi] = w {
                if kw == "mod" {
                    let flat = dir.join(format!("{child}.rs"));
                    let file = if flat.exists() { flat } else { dir.join(child).join("mod.rs") };
                    assert!(file.exists(), "{}: mod {child}; has no file", m.file.display());
                    let mut path = m.path.clone();
                    path.push(child.clone());
                    todo.push(Module { path, file });
                }
            }
        }
        all.push(m);
    }
    all
}

/// The modules each module's file names, as indexes into `mods`.
fn edges(mods: &[Module]) -> Vec<BTreeSet<usize>> {
    let index: BTreeMap<&[String], usize> = mods.iter().enumerate().map(|(i, m)| (m.path.as_slice(), i)).collect();
    mods.iter()
        .map(|m| {
            let src = std::fs::read_to_string(&m.file).unwrap();
            let toks = tokens(production(&src));
            let mut to = BTreeSet::new();
            let mut i = 0;
            while i < toks.len() {
                let starts = matches!(&toks[i], Tok::Ident(_))
                    && toks.get(i + 1) == Some(&Tok::Sep)
                    && (i == 0 || toks[i - 1] != Tok::Sep);
                if !starts {
                    i += 1;
                    continue;
                }
                for p in path_tree(&toks, &mut i) {
                    let mut base: Vec<String> = m.path.clone();
                    let mut rest = p.as_slice();
                    match rest.first().map(String::as_str) {
                        Some("crate") => {
                            base.clear();
                            rest = &rest[1..];
                        }
                        Some("self") => rest = &rest[1..],
                        Some("super") => {
                            while rest.first().map(String::as_str) == Some("super") {
                                base.pop();
                                rest = &rest[1..];
                            }
                        }
                        Some(first) => {
                            let mut child = m.path.clone();
                            child.push(first.to_owned());
                            if !index.contains_key(child.as_slice()) {
                                continue; // another crate, an item, a type's associated item
                            }
                        }
                        None => continue,
                    }
                    for seg in rest {
                        base.push(seg.clone());
                        if !index.contains_key(base.as_slice()) {
                            base.pop();
                            break;
                        }
                    }
                    let target = index[base.as_slice()];
                    if mods[target].path != m.path {
                        to.insert(target);
                    }
                }
            }
            to
        })
        .collect()
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn circles(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut c = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                s.out.push(c);
            }
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(ROOT).unwrap_or(p).display().to_string()
}

#[test]
fn no_import_circle_in_any_crate() {
    let mut found = Vec::new();
    for root in CRATES {
        let mods = modules(&Path::new(ROOT).join(root));
        let edges = edges(&mods);
        for c in circles(&edges) {
            let members: BTreeSet<usize> = c.iter().copied().collect();
            let lines: Vec<String> = c
                .iter()
                .flat_map(|&a| {
                    let mods = &mods;
                    edges[a]
                        .iter()
                        .filter(|b| members.contains(b))
                        .map(move |&b| format!("    {} -> {}", rel(&mods[a].file), rel(&mods[b].file)))
                })
                .collect();
            found.push(format!("a circle in the crate of {root}:\n{}", lines.join("\n")));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_circle_through_super_and_a_child_path() {
    let dir = std::env::temp_dir().join(format!("shardctl-house-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\npub struct S;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "use super::{b::{f}, S};\n// crate::nothing\n").unwrap();
    std::fs::write(dir.join("b.rs"), "pub fn f() { let _ = \"crate::a\"; }\n#[cfg(test)]\nmod t { use super::*; }\n")
        .unwrap();
    let mods = modules(&dir.join("lib.rs"));
    let names = |c: &Vec<usize>| c.iter().map(|&i| mods[i].path.join("::")).collect::<BTreeSet<_>>();
    // a → lib and a → b, nothing back: no circle
    assert!(circles(&edges(&mods)).is_empty());
    // lib naming a's item closes lib ⇄ a
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\npub struct S;\nfn g() { a::x(); }\n").unwrap();
    let found: Vec<_> = circles(&edges(&mods)).iter().map(names).collect();
    assert_eq!(found, vec![BTreeSet::from(["".to_owned(), "a".to_owned()])]);
    // b naming a through crate:: closes a ⇄ b (strings and comments never count)
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\npub struct S;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "pub fn f() { crate::a::g(); }\n").unwrap();
    let found: Vec<_> = circles(&edges(&mods)).iter().map(names).collect();
    assert_eq!(found, vec![BTreeSet::from(["a".to_owned(), "b".to_owned()])]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every production source file: `*.rs` under a crate's `src/` and the Lua scripts.
fn production_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for dir in ["src", "common/src", "coordinator/src", "executor/src", "testkit/src", "bench/src"] {
        walk(&Path::new(ROOT).join(dir), "rs", &mut out);
    }
    walk(&Path::new(ROOT).join("lua"), "lua", &mut out);
    out.sort();
    out
}

#[test]
fn no_production_file_is_over_400_lines() {
    let files = production_files();
    assert!(files.len() > 100, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|p| (p, std::fs::read_to_string(p).unwrap().lines().count()))
        .filter(|(p, n)| {
            let limit = LONG_FOR_NOW.iter().find(|(f, _)| *f == rel(p)).map_or(MAX_LINES, |(_, l)| *l);
            *n > limit
        })
        .map(|(p, n)| format!("{}: {n} lines", rel(p)))
        .collect();
    // a file split below the limit leaves the list
    let shrunk: Vec<&str> = LONG_FOR_NOW
        .iter()
        .filter(|(f, _)| {
            std::fs::read_to_string(Path::new(ROOT).join(f)).map_or(true, |t| t.lines().count() <= MAX_LINES)
        })
        .map(|(f, _)| *f)
        .collect();
    assert!(shrunk.is_empty(), "now at most {MAX_LINES} lines or gone: take them out of LONG_FOR_NOW: {shrunk:?}");
    assert!(long.is_empty(), "over {MAX_LINES} lines:\n{}", long.join("\n"));
}

/// The map and the design notes: ARCHITECTURE.md and `docs/design/*.md`.
fn design_docs() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(ROOT).join("ARCHITECTURE.md")];
    let dir = Path::new(ROOT).join("docs/design");
    let mut design: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    design.sort();
    docs.extend(design);
    docs
}

/// The extensions of the files a doc cites.
const CITED: &[&str] =
    &["rs", "lua", "md", "toml", "json", "js", "mjs", "py", "yml", "yaml", "sh", "txt", "html", "css", "png"];

/// Whether `name` is defined in `text`, a file of type `ext`.
fn defines(text: &str, ext: &str, name: &str) -> bool {
    let patterns: Vec<String> = if ext == "lua" {
        ["function {}(", "local function {}(", "local {} =", "local {},", ", {} ="]
            .iter()
            .map(|p| p.replace("{}", name))
            .collect()
    } else {
        ["fn", "struct", "enum", "trait", "type", "const", "static", "mod", "macro_rules!"]
            .iter()
            .map(|kw| format!("{kw} {name}"))
            .collect()
    };
    patterns.iter().any(|p| {
        text.match_indices(p.as_str()).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + p.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            !word(before) && (ext == "lua" || !word(after))
        })
    })
}

/// What is wrong with the citations of `doc`: every `path/to/file.ext` in backticks exists (a
/// path from the repository root), every `path::name` is defined in its file, every relative
/// link leads to a file.
fn citation_problems(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap();
    let root_files = ["ARCHITECTURE.md", "CHANGELOG.md", "README.md", "Cargo.toml", "Cargo.lock"];
    let mut problems = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        let at = format!("{}:{}", rel(doc), n + 1);
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let (path, name) = match span.split_once("::") {
                Some((p, n)) => (p, Some(n)),
                None => (span, None),
            };
            let Some(ext) = path.rsplit_once('.').map(|(_, e)| e) else { continue };
            let looks_like_path = path.chars().all(|c| c.is_alphanumeric() || "_.-/".contains(c));
            if !CITED.contains(&ext) || !looks_like_path {
                continue;
            }
            if !path.contains('/') && !root_files.contains(&path) {
                problems.push(format!("{at}: `{span}` is not a path from the repository root"));
                continue;
            }
            let file = Path::new(ROOT).join(path);
            let Ok(body) =
                std::fs::read_to_string(&file).or_else(|e| if file.is_dir() { Ok(String::new()) } else { Err(e) })
            else {
                if !file.exists() {
                    problems.push(format!("{at}: `{span}`: no file {path}"));
                }
                continue;
            };
            if let Some(name) = name {
                let plain = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
                if !plain {
                    problems.push(format!("{at}: `{span}`: cite one name after the file"));
                } else if !defines(&body, ext, name) {
                    problems.push(format!("{at}: `{span}`: {path} defines no {name}"));
                }
            }
        }
        let mut rest = line;
        while let Some(open) = rest.find("](") {
            rest = &rest[open + 2..];
            let Some(close) = rest.find(')') else { break };
            let target = rest[..close].split('#').next().unwrap_or_default();
            if !target.is_empty() && !target.contains("://") && !doc.parent().unwrap().join(target).exists() {
                problems.push(format!("{at}: link to {target}, which does not exist"));
            }
        }
    }
    problems
}

#[test]
fn the_design_docs_cite_only_what_exists() {
    let docs = design_docs();
    assert!(docs.len() >= 8, "{docs:?}");
    let problems: Vec<String> = docs.iter().flat_map(|d| citation_problems(d)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_citation_check_sees_a_missing_file_and_an_undefined_name() {
    let dir = std::env::temp_dir().join(format!("shardctl-cite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doc = dir.join("d.md");
    std::fs::write(
        &doc,
        "`tests/house.rs::defines` and `lua/claim.lua` are here; `tests/house.rs::nothing_by_that_name`,\n\
         `tests/gone.rs`, `house.rs` and [a link](nowhere.md) are not.\n```\n`tests/fenced.rs`\n```\n",
    )
    .unwrap();
    let problems = citation_problems(&doc);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(problems.len(), 4, "{problems:#?}");
    for needle in ["nothing_by_that_name", "gone.rs", "`house.rs` is not a path", "nowhere.md"] {
        assert!(problems.iter().any(|p| p.contains(needle)), "{needle}: {problems:#?}");
    }
}

#[test]
fn architecture_md_is_a_map_of_at_most_300_lines() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 300, "ARCHITECTURE.md has {lines} lines: move detail to docs/design/");
    for heading in ["## Glossary", "## Crates", "## Invariants", "## Where to read more"] {
        assert!(text.contains(heading), "ARCHITECTURE.md lacks {heading}");
    }
}
