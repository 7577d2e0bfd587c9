//! The registry: each script's text (a preamble of its declared keys, `lib.lua`, the file),
//! its declared keys, and the invocation with those keys passed in order.

use redis::{Script, ScriptInvocation};
use std::sync::LazyLock;

use crate::keys::Keys;

/// `lua/include/lib.lua`: the helpers every script is built with.
const LIB: &str = include_str!("../../../lua/include/lib.lua");

/// One script of the registry: its Lua text is a preamble made from its header's `KEYS[i] name`
/// lines (the table `K` of declared keys by name, see `lib.lua`), then `lib.lua`, then the file.
/// The header is the one statement of which keys a script touches: the wrappers pass exactly
/// those keys, in that order ([`Lua::keyed`]), and `K` refuses any other name at run time.
pub struct Lua {
    script: Script,
    file: &'static str,
    declared: Vec<String>,
    text: String,
}

impl std::ops::Deref for Lua {
    type Target = Script;
    fn deref(&self) -> &Script {
        &self.script
    }
}

impl Lua {
    fn new(file: &'static str, body: &'static str) -> Self {
        let declared = declared_keys(body).unwrap_or_else(|e| panic!("lua/{file}: {e}"));
        let text = format!("{}\n{LIB}\n{body}", preamble(&declared));
        Lua { script: Script::new(&text), file, declared, text }
    }

    /// One script made of several: each file's body runs as a function of its own, in order,
    /// with its own ARGV; the script's ARGV is, per part, a count and then that many arguments,
    /// and it returns a table of the parts' replies. The keys are the union of the parts'
    /// headers (each checked there), so the parts touch one slot and run as one atomic call.
    fn composed(name: &'static str, parts: &[(&'static str, &'static str)]) -> Self {
        let mut declared: Vec<String> = Vec::new();
        let mut funcs = String::new();
        let mut calls = Vec::new();
        for (i, (file, body)) in parts.iter().enumerate() {
            for k in declared_keys(body).unwrap_or_else(|e| panic!("lua/{file}: {e}")) {
                if !declared.contains(&k) {
                    declared.push(k);
                }
            }
            funcs.push_str(&format!("local function part_{i}(ARGV)\n{body}\nend\n"));
            calls.push(format!("part_{i}"));
        }
        let text = format!(
            "{}\n{LIB}\n{funcs}\nlocal parts, replies, at = {{ {} }}, {{}}, 1\n\
             for p = 1, #parts do\n\
               local m, args = tonumber(ARGV[at]), {{}}\n\
               for i = 1, m do args[i] = ARGV[at + i] end\n\
               at = at + m + 1\n\
               replies[p] = parts[p](args)\n\
             end\n\
             return replies",
            preamble(&declared),
            calls.join(", ")
        );
        Lua { script: Script::new(&text), file: name, declared, text }
    }

    /// The whole text sent to Redis (the preamble, the library and the body).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The file name, e.g. `claim.lua` (for a composed script, its parts' names joined by `+`).
    pub fn file(&self) -> &'static str {
        self.file
    }

    /// The names of the keys its header declares, in KEYS order (`wait`, `task:<id>`, ...).
    pub fn declared(&self) -> &[String] {
        &self.declared
    }

    /// An invocation with every declared key of queue `keys` already passed, in order; `at`
    /// names the task, node or list that the per-entity keys stand for.
    pub fn keyed(&self, keys: &Keys, at: &KeyArgs<'_>) -> ScriptInvocation<'_> {
        let mut inv = self.script.prepare_invoke();
        for name in &self.declared {
            inv.key(queue_key(keys, name, at).unwrap_or_else(|e| panic!("{}: {e}", self.file)));
        }
        inv
    }
}

/// The entities a script's per-entity keys stand for (see [`Lua::keyed`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyArgs<'a> {
    /// `task:<id>` and its keys.
    pub task: Option<&'a str>,
    /// `node:<n>`, `node:<n>:wait`, `node:<n>:marker`.
    pub node: Option<&'a str>,
    /// `source`: a list given by name (rehome).
    pub source: Option<&'a str>,
}

/// The key a header name stands for in queue `keys`.
pub fn queue_key(keys: &Keys, name: &str, at: &KeyArgs<'_>) -> std::result::Result<String, String> {
    let need = |v: Option<&str>, what: &str| v.map(str::to_owned).ok_or(format!("key {name} needs a {what}"));
    let task = || need(at.task, "task id");
    let node = || need(at.node, "node id");
    Ok(match name {
        "meta" => keys.meta(),
        "index" => keys.index(),
        "kinds" => keys.kinds(),
        "wait" => keys.legacy_wait(),
        "tasks" => keys.legacy_tasks(),
        "delayed" => keys.delayed(),
        "active" => keys.active(),
        "leases" => keys.leases(),
        "stalled" => keys.stalled(),
        "stalled-check" => keys.stalled_check(),
        "marker" => keys.marker(),
        "running" => keys.running(),
        "finished" => keys.finished(),
        "events" => keys.events(),
        "nodes" => keys.nodes(),
        "routed-nodes" => keys.routed_nodes(),
        "reroute" => keys.reroute(),
        "unrouted" => keys.unrouted(),
        "unreported" => keys.unreported(),
        "rebalancing" => keys.rebalancing(),
        "scheduled" => keys.scheduled(),
        "expiring" => keys.expiring(),
        "limiter" => keys.limiter(),
        "schedules" => keys.schedules(),
        "schedule-state" => keys.schedule_state(),
        "task:<id>" => keys.task(&task()?),
        "task:<id>:terminal" => keys.terminal(&task()?),
        "task:<id>:results" => keys.results(&task()?),
        "task:<id>:errors" => keys.errors(&task()?),
        "task:<id>:keys" => keys.shard_keys(&task()?),
        "task:<id>:shards" => keys.shards(&task()?),
        "node:<n>" => keys.node(&node()?),
        "node:<n>:wait" => keys.node_wait(&node()?),
        "node:<n>:marker" => keys.node_marker(&node()?),
        "source" => need(at.source, "list")?,
        other => return Err(format!("no queue key is named {other}")),
    })
}

/// The names of a script's `KEYS[i] name` header lines, checked to run 1, 2, 3, ...
pub fn declared_keys(body: &str) -> std::result::Result<Vec<String>, String> {
    let header = body.split("]]").next().unwrap_or_default();
    let mut out = Vec::new();
    for line in header.lines() {
        let Some(rest) = line.trim_start().strip_prefix("KEYS[") else { continue };
        let (n, rest) = rest.split_once(']').ok_or_else(|| format!("malformed header line '{line}'"))?;
        let n: usize = n.parse().map_err(|_| format!("malformed header line '{line}'"))?;
        if n != out.len() + 1 {
            return Err(format!("KEYS[{n}] follows KEYS[{}]", out.len()));
        }
        let name = rest.split_whitespace().next().ok_or_else(|| format!("KEYS[{n}] has no name"))?;
        out.push(name.to_owned());
    }
    Ok(out)
}

/// The Lua identifier of a declared key in `K`: placeholders dropped, other characters `_`
/// (`node:<n>:wait` → `node_wait`, `task:<id>` → `task`, `stalled-check` → `stalled_check`).
pub fn key_ident(name: &str) -> String {
    let mut plain = String::new();
    let mut depth = 0;
    for c in name.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            c if depth == 0 => plain.push(if c.is_ascii_alphanumeric() { c } else { '_' }),
            _ => {}
        }
    }
    plain.split('_').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("_")
}

/// The Lua put before `lib.lua`: `K` (declared keys by name; an undeclared name raises),
/// `DECLARED` (the set of declared key strings) and `TASK_ANCHOR` (see `lib.lua`).
fn preamble(declared: &[String]) -> String {
    let fields: Vec<String> =
        declared.iter().enumerate().map(|(i, n)| format!("{} = KEYS[{}]", key_ident(n), i + 1)).collect();
    format!(
        "local K = setmetatable({{ {} }}, {{ __index = function(_, name) \
         error('shardctl: key ' .. tostring(name) .. ' is not declared by this script') end }})\n\
         local DECLARED = {{}}\n\
         for _, k in ipairs(KEYS) do DECLARED[k] = true end\n\
         local TASK_ANCHOR = rawget(K, 'task')",
        fields.join(", ")
    )
}

/// The registry, from one list: each name is a file `lua/<name>.lua` and a field of
/// [`Scripts`]; [`Scripts::all`] lists them in this order.
macro_rules! registry {
    ($($name:ident),* $(,)?) => {
        /// Every script of the project.
        pub struct Scripts {
            $(
                #[doc = concat!("`lua/", stringify!($name), ".lua`")]
                pub $name: Lua,
            )*
            /// `complete.lua` then `claim.lua` in one call: an executor's completions ride on its
            /// next claim when both are due.
            pub complete_claim: Lua,
        }

        static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $(
                $name: Lua::new(
                    concat!(stringify!($name), ".lua"),
                    include_str!(concat!("../../../lua/", stringify!($name), ".lua")),
                ),
            )*
            complete_claim: Lua::composed(
                "complete.lua+claim.lua",
                &[
                    ("complete.lua", include_str!("../../../lua/complete.lua")),
                    ("claim.lua", include_str!("../../../lua/claim.lua")),
                ],
            ),
        });

        impl Scripts {
            /// Every script of one file.
            pub fn all(&self) -> Vec<&Lua> {
                vec![$(&self.$name),*]
            }
        }
    };
}

registry!(
    dispatch,
    claim,
    extend,
    complete,
    fail,
    release,
    sweep,
    route,
    rehome,
    join,
    leave,
    unlock,
    forget,
    promote,
    disown,
    lock_acquire,
    lock_extend,
    fence_raise,
    limit_fixed,
    limit_sliding,
    limit_bucket,
    cancel,
    retry,
    clean,
    fire,
    reap,
    report,
    ack,
    reopen,
    drop_share,
    dispatch_lease,
    end_share,
    layout,
    unretire,
    uncount,
    move_legacy,
);

/// The registry.
pub fn scripts() -> &'static Scripts {
    &SCRIPTS
}

impl Scripts {
    /// The scripts made of others' files ([`Scripts::complete_claim`]).
    pub fn composed(&self) -> [&Lua; 1] {
        [&self.complete_claim]
    }
}
