//! What Redis holds after a step, read in one pipeline: the queue-level structures the
//! invariants look at, and every key of each task id of the simulation's pool.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use serde_json::Value as Json;
use shardctl_common::conn::Conn;
use shardctl_common::keys::ACTIVE_PIN;
use shardctl_common::Home;

use super::operators::KINDS;

/// Reads everything at once, as one JSON text (a reply of a few hundred values costs the
/// debug-built client far more than the server). KEYS: active, the `kinds` set, delayed, stalled, meta,
/// reroute, unrouted, nodes, routed-nodes, leases (ARGV: the instances after the 3 counts), then each id's
/// `Keys::task_keys` (6 each: the task hash, terminal, results, errors, keys, shards), then one
/// `node:<n>:wait` per node, then each kind's lane wait (`KINDS` order), then `held`, then `backups`. ARGV: the number of
/// instances, of ids, of nodes.
static SNAPSHOT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local function map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end
local function bits(s)
  local b = {}
  for i = 1, #s do
    local c = string.byte(s, i)
    for j = 7, 0, -1 do b[#b + 1] = (math.floor(c / 2 ^ j) % 2 == 1) and '1' or '0' end
  end
  return table.concat(b)
end
local out = {
  active = map(redis.call('HGETALL', KEYS[1])), kinds = redis.call('SMEMBERS', KEYS[2]),
  delayed = redis.call('ZRANGE', KEYS[3], 0, -1), stalled = redis.call('SMEMBERS', KEYS[4]),
  cancels = redis.call('HGET', KEYS[5], 'cancels') or '0', leases = {}, tasks = {},
  reroute = redis.call('LRANGE', KEYS[6], 0, -1), unrouted = redis.call('ZRANGE', KEYS[7], 0, -1),
  nodes = map(redis.call('ZRANGE', KEYS[8], 0, -1, 'WITHSCORES')), routed_nodes = redis.call('SMEMBERS', KEYS[9]),
  lists = {}, lanes = {}, held = map(redis.call('HGETALL', KEYS[#KEYS - 1])),
  backups = map(redis.call('HGETALL', KEYS[#KEYS])),
}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, tonumber(ARGV[1]) do
  -- 0: no lease entry, 1: live, 2: expired (not yet swept)
  local e = redis.call('ZSCORE', KEYS[10], ARGV[3 + i])
  out.leases[i] = (not e and 0) or (tonumber(e) > now and 1) or 2
end
local k = 11
for i = 1, tonumber(ARGV[2]) do
  out.tasks[i] = {
    hash = map(redis.call('HGETALL', KEYS[k])), terminal = bits(redis.call('GET', KEYS[k + 1]) or ''),
    results = map(redis.call('HGETALL', KEYS[k + 2])), errors = map(redis.call('HGETALL', KEYS[k + 3])),
    keys = redis.call('EXISTS', unpack(KEYS, k, k + 5)),
  }
  k = k + 6
end
for i = 1, tonumber(ARGV[3]) do
  out.lists[i] = redis.call('LRANGE', KEYS[k], 0, -1)
  k = k + 1
end
for i = k, #KEYS - 2 do
  out.lanes[#out.lanes + 1] = redis.call('LRANGE', KEYS[i], 0, -1)
end
return cjson.encode(out)
",
    )
});

fn list(v: &Json) -> Vec<String> {
    match v {
        Json::Array(a) => a.iter().map(|x| x.as_str().expect("a string").to_owned()).collect(),
        _ => Vec::new(), // cjson writes an empty table as {}
    }
}

fn map(v: &Json) -> HashMap<String, String> {
    match v {
        Json::Object(o) => o.iter().map(|(k, x)| (k.clone(), x.as_str().expect("a string").to_owned())).collect(),
        _ => HashMap::new(),
    }
}

/// One task id's keys.
#[derive(Debug, Default, Clone)]
pub struct TaskView {
    /// `task:<id>` (empty: no task).
    pub hash: HashMap<String, String>,
    /// `task:<id>:terminal`, bit by bit.
    pub terminal: Vec<bool>,
    /// `task:<id>:results`.
    pub results: HashMap<String, String>,
    /// `task:<id>:errors`.
    pub errors: HashMap<String, String>,
    /// How many of the task's keys exist (`Keys::task_keys`).
    pub keys: u64,
}

impl TaskView {
    /// A numeric field of the task hash (0 when absent).
    pub fn num(&self, f: &str) -> u64 {
        self.hash.get(f).map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("task field {f}={v} is not a number")))
    }

    /// Bit `i` of the terminal bitmap.
    pub fn bit(&self, i: u64) -> bool {
        self.terminal.get(i as usize).copied().unwrap_or(false)
    }

    /// Set bits at or past `from`.
    pub fn bits_from(&self, from: u64) -> Vec<u64> {
        (from..self.terminal.len() as u64).filter(|&i| self.bit(i)).collect()
    }
}

/// The state the invariants are checked on.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// `active` without its pin: ref -> token.
    pub active: HashMap<String, String>,
    /// Every lane's wait, one after the other (`KINDS` order).
    pub wait: Vec<String>,
    /// Each kind's lane wait, in `KINDS` order.
    pub lanes: Vec<Vec<String>>,
    /// The `kinds` set.
    pub kinds: HashSet<String>,
    pub delayed: Vec<String>,
    pub stalled: HashSet<String>,
    /// `meta.cancels`.
    pub cancels: String,
    /// Whether each executor's lease is live, by instance.
    pub leases: HashMap<String, bool>,
    /// The instances whose lease entry is there but expired (the sweep has not seen it yet).
    pub expired: HashSet<String>,
    /// Each pool id's keys.
    pub tasks: HashMap<String, TaskView>,
    pub reroute: Vec<String>,
    pub unrouted: Vec<String>,
    /// `nodes`: node -> alive until (ms).
    pub nodes: HashMap<String, String>,
    pub routed_nodes: HashSet<String>,
    /// `node:<n>:wait` of every executor's node, by node.
    pub lists: Vec<(String, Vec<String>)>,
    /// The counts of `held` (its usages `u:*` left out): task id or `g:<group>` -> count.
    pub held: HashMap<String, u64>,
    /// `backups`: ref -> token of the shard's backup attempt (docs/design/speculation.md).
    pub backups: HashMap<String, String>,
}

impl Snapshot {
    /// Reads it.
    pub async fn read(con: &mut Conn, home: &Home, ids: &[String], instances: &[String], nodes: &[String]) -> Snapshot {
        // one read-only script: one round trip, and a view of one instant
        let mut inv = SNAPSHOT.prepare_invoke();
        inv.key(home.active()).key(home.kinds()).key(home.delayed()).key(home.stalled()).key(home.meta());
        inv.key(home.reroute()).key(home.unrouted()).key(home.nodes()).key(home.routed_nodes());
        inv.key(home.leases());
        inv.arg(instances.len()).arg(ids.len()).arg(nodes.len());
        for i in instances {
            inv.arg(i);
        }
        for id in ids {
            for k in home.task_keys(id) {
                inv.key(k);
            }
        }
        for n in nodes {
            inv.key(home.node_wait(n));
        }
        for k in KINDS {
            inv.key(home.lane_wait(k));
        }
        inv.key(home.held());
        inv.key(home.backups());
        let text: String = inv.invoke_async(con).await.expect("snapshot script");
        let v: Json = serde_json::from_str(&text).expect("snapshot JSON");
        let mut active = map(&v["active"]);
        active.remove(ACTIVE_PIN);
        let mut s = Snapshot {
            active,
            kinds: list(&v["kinds"]).into_iter().collect(),
            delayed: list(&v["delayed"]),
            stalled: list(&v["stalled"]).into_iter().collect(),
            cancels: v["cancels"].as_str().expect("cancels").to_owned(),
            reroute: list(&v["reroute"]),
            unrouted: list(&v["unrouted"]),
            nodes: map(&v["nodes"]),
            routed_nodes: list(&v["routed_nodes"]).into_iter().collect(),
            backups: map(&v["backups"]),
            held: map(&v["held"])
                .into_iter()
                .filter(|(f, _)| !f.starts_with("u:"))
                .map(|(f, n)| (f, n.parse().expect("a count of `held`")))
                .collect(),
            ..Default::default()
        };
        for (n, node) in nodes.iter().enumerate() {
            s.lists.push((node.clone(), list(&v["lists"][n])));
        }
        for n in 0..KINDS.len() {
            s.lanes.push(list(&v["lanes"][n]));
        }
        s.wait = s.lanes.concat();
        for (n, i) in instances.iter().enumerate() {
            s.leases.insert(i.clone(), v["leases"][n] == 1);
            if v["leases"][n] == 2 {
                s.expired.insert(i.clone());
            }
        }
        for (n, id) in ids.iter().enumerate() {
            let t = &v["tasks"][n];
            let view = TaskView {
                hash: map(&t["hash"]),
                terminal: t["terminal"].as_str().expect("bits").bytes().map(|b| b == b'1').collect(),
                results: map(&t["results"]),
                errors: map(&t["errors"]),
                keys: t["keys"].as_u64().expect("a count"),
            };
            s.tasks.insert(id.clone(), view);
        }
        s
    }

    /// Every ref queued in a node list, `reroute`, `wait` or `delayed`, or held.
    pub fn placed(&self) -> impl Iterator<Item = &String> {
        let lists = self.lists.iter().flat_map(|(_, l)| l);
        self.wait.iter().chain(self.active.keys()).chain(&self.delayed).chain(&self.reroute).chain(lists)
    }

    /// The list of `node`.
    pub fn list(&self, node: &str) -> &[String] {
        self.lists.iter().find(|(n, _)| n == node).map_or(&[], |(_, l)| l)
    }

    /// True when `token` holds `r`: its first attempt (`active`) or its backup (`backups`).
    pub fn holds(&self, r: &str, token: &str) -> bool {
        self.active.get(r).is_some_and(|t| t == token) || self.backups.get(r).is_some_and(|t| t == token)
    }

    /// True when the holder of `token` has a live lease.
    pub fn alive(&self, token: &str) -> bool {
        self.leases.get(super::executor::instance_of(token)).copied().unwrap_or(false)
    }

    /// True when the holder of `token` has a lease entry that expired.
    pub fn expired(&self, token: &str) -> bool {
        self.expired.contains(super::executor::instance_of(token))
    }
}
