//! The registry: each script's text (a preamble of its declared keys, the includes its header
//! names, the file), its declared keys, and the invocation with those keys passed in order.

use redis::{Script, ScriptInvocation};
use std::sync::LazyLock;

use crate::keys::Keys;

/// The helper files of `lua/include/` (its README says what each holds), by name.
pub const INCLUDES: &[(&str, &str)] = &[
    ("chunked", include_str!("../../../lua/include/chunked.lua")),
    ("clock", include_str!("../../../lua/include/clock.lua")),
    ("create", include_str!("../../../lua/include/create.lua")),
    ("decide", include_str!("../../../lua/include/decide.lua")),
    ("due", include_str!("../../../lua/include/due.lua")),
    ("durations", include_str!("../../../lua/include/durations.lua")),
    ("events", include_str!("../../../lua/include/events.lua")),
    ("fair", include_str!("../../../lua/include/fair.lua")),
    ("finish", include_str!("../../../lua/include/finish.lua")),
    ("halt", include_str!("../../../lua/include/halt.lua")),
    ("hold", include_str!("../../../lua/include/hold.lua")),
    ("lanes", include_str!("../../../lua/include/lanes.lua")),
    ("settle", include_str!("../../../lua/include/settle.lua")),
    ("share_out", include_str!("../../../lua/include/share_out.lua")),
    ("speculate", include_str!("../../../lua/include/speculate.lua")),
    ("stop", include_str!("../../../lua/include/stop.lua")),
    ("task", include_str!("../../../lua/include/task.lua")),
    ("throughput", include_str!("../../../lua/include/throughput.lua")),
];

/// One script of the registry: its Lua text is a preamble made from its header's `KEYS[i] name`
/// lines (the table `K` of declared keys by name, see `lua/include/task.lua`) and `rcall`, then
/// the includes its header's `include:` line names ([`resolve`]), then the file. The header is
/// the one statement of which keys a script touches: the wrappers pass exactly those keys, in
/// that order ([`Lua::keyed`]), and `K` refuses any other name at run time.
pub struct Lua {
    script: Script,
    file: &'static str,
    declared: Vec<String>,
    includes: Vec<&'static str>,
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
        let includes = resolve(&included(body)).unwrap_or_else(|e| panic!("lua/{file}: {e}"));
        let text = format!("{}\n{}{body}", preamble(&declared), library(&includes));
        Lua::made(file, declared, includes, text)
    }

    /// One script made of several: each file's body runs as a function of its own, in order,
    /// with its own ARGV; the script's ARGV is, per part, a count and then that many arguments,
    /// and it returns a table of the parts' replies. The keys are the union of the parts'
    /// headers (each checked there), so the parts touch one slot and run as one atomic call.
    fn composed(name: &'static str, parts: &[(&'static str, &'static str)]) -> Self {
        let mut declared: Vec<String> = Vec::new();
        let mut funcs = String::new();
        let mut calls = Vec::new();
        let named: Vec<String> = parts.iter().flat_map(|(_, body)| included(body)).collect();
        let includes = resolve(&named).unwrap_or_else(|e| panic!("{name}: {e}"));
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
            "{}\n{}{funcs}\nlocal parts, replies, at = {{ {} }}, {{}}, 1\n\
             for p = 1, #parts do\n\
               local m, args = tonumber(ARGV[at]), {{}}\n\
               for i = 1, m do args[i] = ARGV[at + i] end\n\
               at = at + m + 1\n\
               replies[p] = parts[p](args)\n\
             end\n\
             return replies",
            preamble(&declared),
            library(&includes),
            calls.join(", ")
        );
        Lua::made(name, declared, includes, text)
    }

    fn made(file: &'static str, declared: Vec<String>, includes: Vec<&'static str>, text: String) -> Self {
        Lua { script: Script::new(&text), file, declared, includes, text }
    }

    /// The include files it is built with, each after those it includes (`task`, `lanes`, ...).
    pub fn includes(&self) -> &[&'static str] {
        &self.includes
    }

    /// The whole text sent to Redis (the preamble, the includes and the body).
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
        "held" => keys.held(),
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
        "speculating" => keys.speculating(),
        "backups" => keys.backups(),
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

/// The names of a script's (or an include's) header line `include: a, b` (in the `--[[ ]]`
/// block it starts with); none without one.
pub fn included(text: &str) -> Vec<String> {
    let header = if text.starts_with("--[[") { text.split("]]").next().unwrap_or_default() } else { "" };
    let line = header.lines().find_map(|l| l.trim_start().strip_prefix("include:"));
    line.map(|l| l.split(',').map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect()).unwrap_or_default()
}

/// The include files `names` stand for with those they include, each once and after those it
/// includes; an unknown name, or includes that include each other, are refused.
pub fn resolve(names: &[String]) -> std::result::Result<Vec<&'static str>, String> {
    fn visit(name: &str, out: &mut Vec<&'static str>, path: &mut Vec<&'static str>) -> std::result::Result<(), String> {
        let Some(&(file, text)) = INCLUDES.iter().find(|(n, _)| *n == name) else {
            return Err(format!("no include is named '{name}' (lua/include/)"));
        };
        if out.contains(&file) {
            return Ok(());
        }
        if path.contains(&file) {
            return Err(format!("includes include each other: {} -> {file}", path.join(" -> ")));
        }
        path.push(file);
        for n in included(text) {
            visit(&n, out, path)?;
        }
        path.pop();
        out.push(file);
        Ok(())
    }
    let mut out = Vec::new();
    for n in names {
        visit(n, &mut out, &mut Vec::new())?;
    }
    Ok(out)
}

/// The text of include files, in order.
fn library(includes: &[&str]) -> String {
    let text = |name: &&str| INCLUDES.iter().find(|(n, _)| n == name).map_or("", |(_, t)| *t);
    includes.iter().map(|n| format!("{}\n", text(n))).collect()
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

/// The Lua put before the includes: `K` (declared keys by name; an undeclared name raises),
/// `DECLARED` (the set of declared key strings), `TASK_ANCHOR` (see `lua/include/task.lua`) and
/// `rcall` (`redis.call`).
fn preamble(declared: &[String]) -> String {
    let fields: Vec<String> =
        declared.iter().enumerate().map(|(i, n)| format!("{} = KEYS[{}]", key_ident(n), i + 1)).collect();
    format!(
        "local K = setmetatable({{ {} }}, {{ __index = function(_, name) \
         error('shardctl: key ' .. tostring(name) .. ' is not declared by this script') end }})\n\
         local DECLARED = {{}}\n\
         for _, k in ipairs(KEYS) do DECLARED[k] = true end\n\
         local TASK_ANCHOR = rawget(K, 'task')\n\
         local rcall = redis.call",
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
    decide,
    stop_share,
);

/// The registry. Its texts are registered for the `NOSCRIPT` answer of a cluster connection
/// ([`crate::script_texts`]) the first time it is asked for.
pub fn scripts() -> &'static Scripts {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        for s in SCRIPTS.all().into_iter().chain(SCRIPTS.composed()) {
            crate::script_texts::register(s.get_hash(), s.text());
        }
    });
    &SCRIPTS
}

impl Scripts {
    /// The scripts made of others' files ([`Scripts::complete_claim`]).
    pub fn composed(&self) -> [&Lua; 1] {
        [&self.complete_claim]
    }
}
