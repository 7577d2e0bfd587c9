//! The Lua scripts, one per atomic operation (`lua/`), held in one registry and called through
//! typed wrappers that know each script's KEYS and ARGV order. Scripts are called by SHA;
//! `redis::Script` loads one on the NOSCRIPT reply (after a restart or a `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, ScriptInvocation, Value};

use crate::error::{Error, Result, ScriptCode};
use crate::keys::Keys;
use crate::model::{Part, ShardRef, TaskSpec};

/// `lua/include/lib.lua`: the helpers every script is built with.
const LIB: &str = include_str!("../../lua/include/lib.lua");

/// One script of the registry: its Lua text is a preamble made from its header's `KEYS[i] name`
/// lines (the table `K` of declared keys by name, see `lib.lua`), then `lib.lua`, then the file.
/// The header is the one statement of which keys a script touches: the wrappers pass exactly
/// those keys, in that order ([`Lua::keyed`]), and `K` refuses any other name at run time.
pub struct Lua {
    script: Script,
    file: &'static str,
    declared: Vec<String>,
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
        Lua { script: Script::new(&text), file, declared }
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
        Lua { script: Script::new(&text), file: name, declared }
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
        "tasks" => keys.tasks(),
        "index" => keys.index(),
        "wait" => keys.wait(),
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
                    include_str!(concat!("../../lua/", stringify!($name), ".lua")),
                ),
            )*
            complete_claim: Lua::composed(
                "complete.lua+claim.lua",
                &[
                    ("complete.lua", include_str!("../../lua/complete.lua")),
                    ("claim.lua", include_str!("../../lua/claim.lua")),
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

/// One shard handed to an executor by [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Which shard.
    pub shard_ref: ShardRef,
    /// The token that holds its lock.
    pub token: String,
    /// Claims of this shard so far, this one included (1 on the first).
    pub attempt: u32,
    /// Failed attempts so far.
    pub fails: u32,
}

impl Claimed {
    /// True when the shard may have state in `task:<id>:shards` to remove with it.
    pub fn has_state(&self) -> bool {
        self.shard_ref.is_aggregate() || self.attempt > 1 || self.fails > 0
    }
}

/// What one claim call returned.
#[derive(Debug, Clone, Default)]
pub struct ClaimOutcome {
    /// The shards claimed (at most the count asked for).
    pub shards: Vec<Claimed>,
    /// The queue is paused.
    pub paused: bool,
    /// When nothing was claimed: how many ms from now (by the Redis server's clock) the earliest
    /// delayed shard or task is due, or the queue's rate limit lets the next shard start.
    pub next_due_in_ms: Option<u64>,
    /// The claim had to take the executor's lease again (it had expired): some held shards may
    /// have been recovered meanwhile, so the executor must check its tokens (see [`extend`]).
    pub lease_lapsed: bool,
    /// The queue has a rate limit and every shard asked for was wanted ahead: nothing was
    /// claimed; ask again when a run slot frees.
    pub busy: bool,
    /// The queue has a rate limit: hold nothing ahead (shards claimed ahead before the limit
    /// was set would start uncounted).
    pub limited: bool,
}

/// A finished attempt, as reported by an executor.
#[derive(Debug, Clone)]
pub struct Finished<'a> {
    /// The claim.
    pub claim: &'a Claimed,
    /// What to record.
    pub outcome: FinishedAs<'a>,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub enum FinishedAs<'a> {
    /// Success with a result (JSON text; empty when there is nothing to keep).
    Completed(&'a str),
    /// Failure, with the backoff before the next attempt and the reason.
    Failed {
        /// Backoff before the next attempt (unused when none is left).
        delay_ms: u64,
        /// Why it failed.
        reason: &'a str,
    },
}

fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(Error::Protocol(format!("expected an integer from a script, got {other:?}"))),
    }
}

fn string(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|e| Error::Protocol(e.to_string())),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(Error::Protocol(format!("expected a string from a script, got {other:?}"))),
    }
}

/// Creates a task (its times are the Redis server's). Fails with [`ScriptCode::TaskExists`]
/// when the id is taken.
pub async fn dispatch<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, spec: &TaskSpec) -> Result<()> {
    let mut inv = scripts().dispatch.keyed(keys, &KeyArgs { task: Some(&spec.id), ..Default::default() });
    inv.arg(keys.prefix()).arg(&spec.id).arg(spec.priority).arg(spec.delay.map_or(0, |d| d.as_millis() as u64));
    for (f, v) in spec.fields() {
        inv.arg(f).arg(v);
    }
    let code: i64 = inv.invoke_async(con).await?;
    match ScriptCode::from_code(code) {
        None => Ok(()),
        Some(c) => Err(Error::Script(c)),
    }
}

/// What [`claim`] asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Shards wanted.
    pub count: usize,
    /// Lock time to live.
    pub lock_ms: u64,
    /// The executor's instance: its lease is its entry in `leases` and the token of this claim
    /// is `<instance>:<seq>`.
    pub token_base: &'a str,
    /// This claim's sequence number (one token per claim call).
    pub seq: u64,
    /// The executor's node id: refs routed to it are claimed too.
    pub node: &'a str,
    /// How many of `count` are wanted ahead of a free run slot (they wait, held, until one frees).
    /// Under a queue rate limit the claim takes only the others, so that the limit counts starts:
    /// with none startable now it claims nothing and says [`ClaimOutcome::busy`].
    pub ahead: usize,
}

/// Claims up to `req.count` shards under one token, and renews the executor's lease.
pub async fn claim<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, req: &ClaimRequest<'_>) -> Result<ClaimOutcome> {
    let token = format!("{}:{}", req.token_base, req.seq);
    let mut inv = scripts().claim.keyed(keys, &KeyArgs { node: Some(req.node), ..Default::default() });
    claim_args(&mut inv, keys, req, &token);
    let v: Vec<Value> = inv.invoke_async(con).await?;
    parse_claim(&v, &token)
}

/// Records `completed` (every item a completion; codes as [`finish`]'s) and then claims as
/// [`claim`] does, in one script call (`complete.lua` then `claim.lua`, atomically).
pub async fn complete_and_claim<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    completed: &[Finished<'_>],
    req: &ClaimRequest<'_>,
) -> Result<(ItemCodes, ClaimOutcome)> {
    let token = format!("{}:{}", req.token_base, req.seq);
    let mut order: Vec<usize> = (0..completed.len()).collect();
    let mut inv = scripts().complete_claim.keyed(keys, &KeyArgs { node: Some(req.node), ..Default::default() });
    inv.arg(completion_argc(completed, &mut order)?);
    completion_args(&mut inv, keys, completed, &order);
    inv.arg(CLAIM_ARGC);
    claim_args(&mut inv, keys, req, &token);
    let (c, v): (Vec<i64>, Vec<Value>) = inv.invoke_async(con).await?;
    let mut out: ItemCodes = vec![Ok(0); completed.len()];
    for (&i, c) in order.iter().zip(codes(c)) {
        out[i] = c;
    }
    Ok((out, parse_claim(&v, &token)?))
}

/// How many arguments [`claim_args`] passes.
const CLAIM_ARGC: usize = 5;

fn claim_args(inv: &mut ScriptInvocation<'_>, keys: &Keys, req: &ClaimRequest<'_>, token: &str) {
    inv.arg(keys.prefix()).arg(req.count).arg(req.lock_ms).arg(token).arg(req.count.saturating_sub(req.ahead));
}

fn parse_claim(v: &[Value], token: &str) -> Result<ClaimOutcome> {
    let [head, flags, shards @ ..] = v else {
        return Err(Error::Protocol("short claim reply".into()));
    };
    let head = int(head)?;
    let mut out = ClaimOutcome {
        paused: head == -2,
        busy: head == -3,
        next_due_in_ms: (head > 0).then_some(head as u64),
        lease_lapsed: int(flags)? & 1 == 1,
        limited: int(flags)? & 2 == 2,
        ..Default::default()
    };
    for triple in shards.chunks(3) {
        let [r, a, f] = triple else {
            return Err(Error::Protocol("claim reply is not ref/attempt/fails triples".into()));
        };
        let first: ShardRef = string(r)?.parse()?;
        match (int(a)?, &first.part) {
            // a run of k fresh shards from `first`: attempt 1, no fails
            (a, &Part::Shard(from)) if a < 0 => {
                for i in from..from + a.unsigned_abs() {
                    let shard_ref = ShardRef { part: Part::Shard(i), ..first.clone() };
                    out.shards.push(Claimed { shard_ref, token: token.to_owned(), attempt: 1, fails: 0 });
                }
            }
            (a, _) if a < 0 => return Err(Error::Protocol(format!("claim reply: a run from {first}"))),
            (a, _) => out.shards.push(Claimed {
                shard_ref: first,
                token: token.to_owned(),
                attempt: a as u32,
                fails: int(f)? as u32,
            }),
        }
    }
    Ok(out)
}

/// What a heartbeat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// Positions (0-based) in `held` of the shards lost.
    pub lost: Vec<usize>,
    /// Positions (0-based) in `held` of shards lost because their task was cancelled.
    pub cancelled: Vec<usize>,
    /// The queue's cancellation count (pass it to the next [`extend`]).
    pub cancels: String,
}

/// The heartbeat of executor `instance`: extends its lease by `lock_ms`, one call when the lease
/// lived and no task was cancelled since `cancels` was read. If the lease had expired, tasks were
/// cancelled, or `check` asks for it (a claim took a lapsed lease again), a call with `held`
/// (ref, token) compares the tokens and takes the lease again.
pub async fn extend<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    instance: &str,
    lock_ms: u64,
    held: &[(String, String)],
    check: bool,
    cancels: &str,
) -> Result<Beat> {
    let call = |mode: &str, pairs: &[(String, String)]| {
        let mut inv = scripts().extend.keyed(keys, &KeyArgs::default());
        inv.arg(instance).arg(lock_ms).arg(mode).arg(cancels);
        for (r, t) in pairs {
            inv.arg(r).arg(t);
        }
        inv
    };
    let parse = |v: Vec<Value>| -> Result<(i64, Beat)> {
        let [status, cancels, lost @ ..] = v.as_slice() else {
            return Err(Error::Protocol("short heartbeat reply".into()));
        };
        let mut beat = Beat { cancels: string(cancels)?, ..Default::default() };
        for p in lost {
            // a negative pair number: lost because its task was cancelled
            match int(p)? {
                p if p > 0 => beat.lost.push(p as usize - 1),
                p if p < 0 => beat.cancelled.push((-p) as usize - 1),
                _ => return Err(Error::Protocol("pair number 0 in a heartbeat reply".into())),
            }
        }
        Ok((int(status)?, beat))
    };
    if !check {
        let (status, beat) = parse(call("beat", &[]).invoke_async(con).await?)?;
        if status == 0 {
            return Ok(beat);
        }
    }
    Ok(parse(call("check", held).invoke_async(con).await?)?.1)
}

/// The result a completion keeps (empty for none); an error for a failure.
fn result_of<'a>(f: &Finished<'a>) -> Result<&'a str> {
    match f.outcome {
        FinishedAs::Completed(r) => Ok(r),
        FinishedAs::Failed { .. } => Err(Error::Invalid("only completions are recorded by complete.lua".into())),
    }
}

/// Whether a completion is plain: a shard without state or result, one argument in its group.
fn plain(f: &Finished<'_>) -> bool {
    !f.claim.has_state() && !f.claim.shard_ref.is_aggregate() && matches!(f.outcome, FinishedAs::Completed(""))
}

/// The group of a completion in `complete.lua`'s arguments: task, incarnation, token, plain.
fn group_of<'a>(f: &Finished<'a>) -> (&'a str, u64, &'a str, bool) {
    let c = f.claim;
    (c.shard_ref.task.as_str(), c.shard_ref.inc, c.token.as_str(), plain(f))
}

/// Sorts `order` (indexes into `items`, all completions) into `complete.lua`'s groups, and
/// returns how many arguments [`completion_args`] will pass.
fn completion_argc(items: &[Finished<'_>], order: &mut [usize]) -> Result<usize> {
    // grouped by task, token and whether plain (a shard without state or result): the script
    // parses no refs, reads one index per plain shard, and touches each task's keys once
    order.sort_by(|&a, &b| group_of(&items[a]).cmp(&group_of(&items[b])));
    let mut n = 1;
    for group in order.chunk_by(|&a, &b| group_of(&items[a]) == group_of(&items[b])) {
        for &i in group {
            result_of(&items[i])?;
        }
        n += 5 + group.len() * if plain(&items[group[0]]) { 1 } else { 3 };
    }
    Ok(n)
}

/// `complete.lua`'s arguments for `items` in `order` (from [`completion_argc`]).
fn completion_args(inv: &mut ScriptInvocation<'_>, keys: &Keys, items: &[Finished<'_>], order: &[usize]) {
    inv.arg(keys.prefix());
    for group in order.chunk_by(|&a, &b| group_of(&items[a]) == group_of(&items[b])) {
        let (task, inc, token, plain) = group_of(&items[group[0]]);
        inv.arg(task).arg(inc).arg(token).arg(group.len()).arg(if plain { "p" } else { "f" });
        for &i in group {
            let it = &items[i];
            match it.claim.shard_ref.part {
                Part::Shard(idx) => inv.arg(idx),
                Part::Aggregate => inv.arg("agg"),
            };
            if !plain {
                inv.arg(u8::from(it.claim.has_state())).arg(result_of(it).unwrap_or_default());
            }
        }
    }
}

/// Per-item result codes of the batch scripts: `Ok(n)` with n ≥ 0, or the refusal.
pub type ItemCodes = Vec<std::result::Result<i64, ScriptCode>>;

fn codes(v: Vec<i64>) -> ItemCodes {
    v.into_iter()
        .map(|c| match ScriptCode::from_code(c) {
            None => Ok(c),
            Some(e) => Err(e),
        })
        .collect()
}

/// Records completions (code 1 counted, 0 already terminal) and failures (2 retry scheduled,
/// 1 failed for good, 0 already terminal), each checked against its token. One code per item,
/// in the order given.
pub async fn finish<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    node: &str,
    items: &[Finished<'_>],
) -> Result<ItemCodes> {
    let (mut complete, mut fail) = (Vec::new(), Vec::new());
    for (i, it) in items.iter().enumerate() {
        match it.outcome {
            FinishedAs::Completed(_) => complete.push(i),
            FinishedAs::Failed { .. } => fail.push(i),
        }
    }
    let mut out: ItemCodes = vec![Ok(0); items.len()];
    if !complete.is_empty() {
        let items_done: Vec<Finished<'_>> = complete.iter().map(|&i| items[i].clone()).collect();
        let mut order: Vec<usize> = (0..items_done.len()).collect();
        completion_argc(&items_done, &mut order)?;
        let mut inv = scripts().complete.keyed(keys, &KeyArgs::default());
        completion_args(&mut inv, keys, &items_done, &order);
        let complete: Vec<usize> = order.iter().map(|&j| complete[j]).collect();
        let c: Vec<i64> = inv.invoke_async(con).await?;
        for (&i, c) in complete.iter().zip(codes(c)) {
            out[i] = c;
        }
    }
    if !fail.is_empty() {
        let mut inv = scripts().fail.keyed(keys, &KeyArgs::default());
        inv.arg(keys.prefix()).arg(node);
        for &i in &fail {
            let it = &items[i];
            let FinishedAs::Failed { delay_ms, reason } = it.outcome else { unreachable!() };
            inv.arg(it.claim.shard_ref.to_string())
                .arg(&it.claim.token)
                .arg(it.claim.attempt)
                .arg(delay_ms)
                .arg(reason);
        }
        let c: Vec<i64> = inv.invoke_async(con).await?;
        for (&i, c) in fail.iter().zip(codes(c)) {
            out[i] = c;
        }
    }
    Ok(out)
}

/// Gives claimed shards back to the front of `wait` (1 released), each checked against its token.
pub async fn release<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, claims: &[&Claimed]) -> Result<ItemCodes> {
    release_as(con, keys, claims, GiveBack::Started).await
}

/// Which shards [`release_as`] gives back, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// Shards that ran (stopped at shutdown): to the front of `wait`; the claim counted.
    Started,
    /// Shards claimed ahead that never started: to the front of `wait`, the claim undone (the
    /// next claim hands out the same `attempt`).
    Unstarted,
    /// Shards claimed ahead that never started: to the back of `wait`, behind the aggregation
    /// jobs and retries waiting there, the claim undone.
    Behind,
}

/// Gives claimed shards back as `how` says, each checked against its token.
pub async fn release_as<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    claims: &[&Claimed],
    how: GiveBack,
) -> Result<ItemCodes> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let mode = match how {
        GiveBack::Started => "front",
        GiveBack::Unstarted => "unstarted",
        GiveBack::Behind => "back",
    };
    let mut inv = scripts().release.keyed(keys, &KeyArgs::default());
    inv.arg(keys.prefix()).arg(mode);
    for c in claims {
        inv.arg(c.shard_ref.to_string()).arg(&c.token);
    }
    let c: Vec<i64> = inv.invoke_async(con).await?;
    Ok(codes(c))
}

/// How long executor `instance`'s lease has left by the server's clock; `None` when it has none or
/// it expired (its shards are the sweep's).
pub async fn lease_left_ms<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, instance: &str) -> Result<Option<u64>> {
    let expiry: Option<u64> = redis::cmd("ZSCORE").arg(keys.leases()).arg(instance).query_async(con).await?;
    let Some(expiry) = expiry else { return Ok(None) };
    let now = crate::time::server_now_ms(con, keys).await?;
    Ok(expiry.checked_sub(now).filter(|&l| l > 0))
}

/// What one stalled sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Stalled shards put back in `wait`.
    pub recovered: u64,
    /// Stalled shards failed for good (over the cap).
    pub failed: u64,
    /// Active shards whose holder has no lease entry at all, marked for the next full sweep to
    /// confirm.
    pub marked: u64,
}

/// One call of the sweep: what it did, and when to call again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// `None` when nothing ran: no lease had expired and the full sweep ran within its interval.
    pub report: Option<SweepReport>,
    /// How long from now (the server's clock) the earliest live lease expires; `None` when no
    /// executor holds one. The sweep loop calls again then, so that a dead executor's shards
    /// come back as soon as its lease runs out.
    pub next_expiry_in_ms: Option<u64>,
}

/// The reason a shard fails with once it stalled more than allowed.
pub const STALLED_REASON: &str = "shard stalled more than allowable limit";

/// Recovers the shards of every executor whose lease expired, and runs the full sweep (which
/// also finds shards whose holder has no lease at all) unless another ran within `interval_ms`.
pub async fn sweep<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    interval_ms: u64,
    max_stalled: u32,
) -> Result<Sweep> {
    let v: Vec<i64> = scripts()
        .sweep
        .keyed(keys, &KeyArgs::default())
        .arg(keys.prefix())
        .arg(interval_ms.max(1))
        .arg(max_stalled)
        .arg(STALLED_REASON)
        .invoke_async(con)
        .await?;
    let [ran, r, f, m, next] = v.as_slice() else {
        return Err(Error::Protocol(format!("sweep reply {v:?}")));
    };
    Ok(Sweep {
        report: (*ran == 1).then_some(SweepReport { recovered: *r as u64, failed: *f as u64, marked: *m as u64 }),
        next_expiry_in_ms: (*next >= 0).then_some(*next as u64),
    })
}

fn code_result(code: i64) -> Result<i64> {
    match ScriptCode::from_code(code) {
        None => Ok(code),
        Some(c) => Err(Error::Script(c)),
    }
}

/// Places shards `[from, from + owners.len())` of a routed task: `owners[i]` is the node of shard
/// `from + i`. Returns the new placement cursor; [`ScriptCode::RouteMoved`] when `from` is stale.
pub async fn route<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    task: &str,
    from: u64,
    owners: &[&str],
) -> Result<u64> {
    let mut nodes: Vec<&str> = owners.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let mut inv = scripts().route.keyed(keys, &KeyArgs { task: Some(task), ..Default::default() });
    inv.arg(keys.prefix()).arg(task).arg(from).arg(nodes.len());
    for n in &nodes {
        inv.arg(*n);
    }
    for o in owners {
        inv.arg(nodes.binary_search(o).expect("owner listed") + 1);
    }
    let code: i64 = inv.invoke_async(con).await?;
    code_result(code).map(|c| c as u64)
}

/// Moves the refs `head` at the start of list `source` to their nodes (`dest[i]` for `head[i]`).
/// [`ScriptCode::HeadChanged`] when the list no longer starts with them.
pub async fn rehome<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    source: &str,
    head: &[String],
    dest: &[&str],
) -> Result<u64> {
    assert_eq!(head.len(), dest.len(), "one destination per ref");
    let mut inv = scripts().rehome.keyed(keys, &KeyArgs { source: Some(source), ..Default::default() });
    inv.arg(keys.prefix()).arg(head.len());
    for r in head {
        inv.arg(r);
    }
    for d in dest {
        inv.arg(*d);
    }
    let code: i64 = inv.invoke_async(con).await?;
    code_result(code).map(|c| c as u64)
}

/// Who holds a node id, when [`join`] is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHolder {
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: String,
    /// Milliseconds since its last heartbeat.
    pub age_ms: u64,
}

/// Joins the membership or refreshes this instance's heartbeat; `Err(holder)` when another
/// live instance holds the node id.
pub async fn join<C: ConnectionLike + Send>(
    con: &mut C,
    keys: &Keys,
    node: &str,
    instance: &str,
    timeout_ms: u64,
    fields: &[(&str, String)],
) -> Result<std::result::Result<(), NodeHolder>> {
    let mut inv = scripts().join.keyed(keys, &KeyArgs { node: Some(node), ..Default::default() });
    inv.arg(node).arg(instance).arg(timeout_ms);
    for (f, v) in fields {
        inv.arg(*f).arg(v);
    }
    let v: Vec<Value> = inv.invoke_async(con).await?;
    match v.as_slice() {
        [c] if int(c)? == 1 => Ok(Ok(())),
        [c, h, p, a] if int(c)? == -5 => {
            Ok(Err(NodeHolder { host: string(h)?, pid: string(p)?, age_ms: int(a)?.max(0) as u64 }))
        }
        other => Err(Error::Protocol(format!("join reply {other:?}"))),
    }
}

/// Leaves the membership if this instance holds the node id; true when it did.
pub async fn leave<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, node: &str, instance: &str) -> Result<bool> {
    let r: i64 = scripts()
        .leave
        .keyed(keys, &KeyArgs { node: Some(node), ..Default::default() })
        .arg(node)
        .arg(instance)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

/// Deletes `key` if `token` still holds it; true when it did.
pub async fn unlock<C: ConnectionLike + Send>(con: &mut C, key: &str, token: &str) -> Result<bool> {
    let r: i64 = scripts().unlock.key(key).arg(token).invoke_async(con).await?;
    Ok(r == 1)
}

/// Forgets departed `node` if its routed list is empty; true when it did.
pub async fn forget<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, node: &str) -> Result<bool> {
    let r: i64 = scripts()
        .forget
        .keyed(keys, &KeyArgs { node: Some(node), ..Default::default() })
        .arg(node)
        .invoke_async(con)
        .await?;
    Ok(r == 1)
}

/// Moves due retries from `delayed` to `wait`; returns how many.
pub async fn promote<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<u64> {
    let n: i64 = scripts().promote.keyed(keys, &KeyArgs::default()).arg(keys.prefix()).invoke_async(con).await?;
    Ok(n.max(0) as u64)
}

/// Nodes by liveness, judged by the Redis server's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Nodes whose membership ran out: removed, with their `node:<n>` hash, by this call.
    pub departed: Vec<String>,
    /// The live nodes, sorted.
    pub live: Vec<String>,
}

/// Removes departed nodes from the membership atomically and returns them with the live ones.
pub async fn reap<C: ConnectionLike + Send>(con: &mut C, keys: &Keys) -> Result<Reaped> {
    let v: Vec<String> = scripts().reap.keyed(keys, &KeyArgs::default()).arg(keys.prefix()).invoke_async(con).await?;
    let split = v
        .iter()
        .position(String::is_empty)
        .ok_or_else(|| Error::Protocol("reap reply without its separator".into()))?;
    let mut live = v[split + 1..].to_vec();
    live.sort();
    Ok(Reaped { departed: v[..split].to_vec(), live })
}

/// Gives back `(ref, token)` shards held under an executor's tokens that it does not know (a claim
/// whose reply was lost), each only if that token still holds it; returns how many.
pub async fn disown<C: ConnectionLike + Send>(con: &mut C, keys: &Keys, held: &[(String, String)]) -> Result<u64> {
    if held.is_empty() {
        return Ok(0);
    }
    let mut inv = scripts().disown.keyed(keys, &KeyArgs::default());
    inv.arg(keys.prefix());
    for (r, t) in held {
        inv.arg(r).arg(t);
    }
    let n: i64 = inv.invoke_async(con).await?;
    Ok(n.max(0) as u64)
}
