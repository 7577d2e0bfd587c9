//! Placing routed shards on node lists: the owner of each ref under the current membership, the
//! chunked placement of a task (`route.lua`, resumable through the task's `routed` cursor), and
//! moving the refs of a list to their owners (`rehome.lua`).

use std::collections::HashMap;

use redis::AsyncCommands;
use shardctl_common::conn::Conn;
use shardctl_common::kinds::Served;
use shardctl_common::model::{Job, ShardRef};
use shardctl_common::ring::{Placement, Strategy};
use shardctl_common::{scripts, Error, Keys, Result, ScriptCode};

/// Refs placed or moved per script call.
pub const CHUNK: usize = 5_000;

#[derive(Debug, Clone)]
struct TaskRouting {
    strategy: Strategy,
    vnodes: u32,
    has_keys: bool,
    /// A share's first task index (0 for a task in one keyspace): a shard is placed by its
    /// task index, so a task's placement is the same over any number of partitions.
    base: u64,
    /// Its kind: placed on the members that serve it.
    kind: String,
}

/// What each of the live members `live` of `home` announces it serves (a member that announced
/// nothing, or something unreadable, is left out: it serves every kind).
pub async fn served(con: &mut Conn, home: &shardctl_common::Home, live: &[String]) -> Result<HashMap<String, Served>> {
    let mut pipe = redis::pipe();
    for n in live {
        pipe.hget(home.node(n), "kinds");
    }
    let kinds: Vec<Option<String>> = pipe.query_async(con).await?;
    Ok(live.iter().zip(kinds).filter_map(|(n, k)| Some((n.clone(), Served::parse(&k?).ok()?))).collect())
}

/// Owners of refs under one membership; caches each task's strategy and each placement.
pub struct Router {
    live: Vec<String>,
    /// What each live member serves (`None`: it announced nothing, taken as every kind).
    served: HashMap<String, Served>,
    /// Keys whose time to live is renewed after every chunk (the rebalancer's lock and flag).
    keep_alive: Vec<String>,
    keep_alive_ttl: std::time::Duration,
    tasks: HashMap<String, Option<TaskRouting>>,
    /// By strategy, vnodes and the members placed over.
    placements: HashMap<(Strategy, u32, Vec<String>), Placement>,
}

impl Router {
    /// A router over the live members (must not be empty).
    pub fn new(live: Vec<String>) -> Self {
        assert!(!live.is_empty(), "a router needs a member");
        Router {
            live,
            served: HashMap::new(),
            keep_alive: Vec::new(),
            keep_alive_ttl: std::time::Duration::ZERO,
            tasks: HashMap::new(),
            placements: HashMap::new(),
        }
    }

    /// A router over the live members `live` of `home`, each placed on only for the kinds its
    /// membership announces (see [`Router::serving`]).
    pub async fn over(con: &mut Conn, home: &shardctl_common::Home, live: Vec<String>) -> Result<Self> {
        let served = served(con, home, &live).await?;
        let mut r = Router::new(live);
        r.serving(served);
        Ok(r)
    }

    /// The members and what each serves, as one text: a change of either re-places the lists.
    pub fn signature(&self) -> String {
        let each: Vec<String> = self
            .live
            .iter()
            .map(|n| match self.served.get(n) {
                Some(s) => format!("{n}={s}"),
                None => n.clone(),
            })
            .collect();
        each.join(",")
    }

    /// Places each task's shards only on the members that serve its kind (docs/design/lanes.md), as
    /// `served` says; a member not in it serves every kind. A task whose kind no
    /// live member serves is placed over all of them: their claims move its refs to its lane.
    pub fn serving(&mut self, served: HashMap<String, Served>) {
        self.served = served;
        self.placements.clear();
    }

    /// The live members that serve `kind` (all of them when none does).
    fn members(&self, kind: &str) -> Vec<String> {
        let v: Vec<String> =
            self.live.iter().filter(|n| self.served.get(*n).is_none_or(|s| s.serves(kind))).cloned().collect();
        if v.is_empty() {
            self.live.clone()
        } else {
            v
        }
    }

    /// Renews the time to live of `keys` after every chunk placed or moved.
    pub fn keep_alive(&mut self, keys: Vec<String>, ttl: std::time::Duration) {
        self.keep_alive = keys;
        self.keep_alive_ttl = ttl;
    }

    async fn renew(&self, con: &mut Conn) -> Result<()> {
        if self.keep_alive.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for k in &self.keep_alive {
            // PEXPIRE XX semantics: only keys that exist (the flag may not be set)
            pipe.cmd("PEXPIRE").arg(k).arg(self.keep_alive_ttl.as_millis() as u64).ignore();
        }
        let () = pipe.query_async(con).await?;
        Ok(())
    }

    async fn task(&mut self, con: &mut Conn, keys: &Keys, id: &str) -> Result<Option<TaskRouting>> {
        if let Some(t) = self.tasks.get(id) {
            return Ok(t.clone());
        }
        #[allow(clippy::type_complexity)]
        let (strategy, vnodes, has_keys, base, kind): (
            Option<String>,
            Option<u32>,
            Option<String>,
            Option<u64>,
            Option<String>,
        ) = redis::cmd("HMGET")
            .arg(keys.task(id))
            .arg(&["strategy", "vnodes", "has_keys", "base", "kind"])
            .query_async(con)
            .await?;
        let t = strategy.map(|s| TaskRouting {
            strategy: s.parse().unwrap_or(Strategy::ConsistentHash),
            vnodes: vnodes.unwrap_or(shardctl_common::ring::DEFAULT_VNODES),
            has_keys: has_keys.as_deref() == Some("1"),
            base: base.unwrap_or(0),
            kind: kind.unwrap_or_default(),
        });
        self.tasks.insert(id.to_owned(), t.clone());
        Ok(t)
    }

    fn placement(&mut self, strategy: Strategy, vnodes: u32, kind: &str) -> &Placement {
        let members = self.members(kind);
        self.placements.entry((strategy, vnodes, members)).or_insert_with_key(|(s, v, m)| Placement::new(*s, m, *v))
    }

    /// The owner of every shard index in `indexes` of task `id` (`None` if the task is gone).
    async fn owners(&mut self, con: &mut Conn, keys: &Keys, id: &str, indexes: &[u64]) -> Result<Option<Vec<String>>> {
        let Some(t) = self.task(con, keys, id).await? else { return Ok(None) };
        // a share's keys are at its own indexes; its shards are placed by their task index
        let shard_keys: Vec<String> = if t.has_keys && !indexes.is_empty() {
            let v: Vec<Option<String>> =
                redis::cmd("HMGET").arg(keys.shard_keys(id)).arg(indexes).query_async(con).await?;
            v.into_iter().zip(indexes).map(|(k, i)| k.unwrap_or_else(|| (t.base + i).to_string())).collect()
        } else {
            indexes.iter().map(|i| (t.base + i).to_string()).collect()
        };
        let strategy = if t.strategy == Strategy::Pull { Strategy::ConsistentHash } else { t.strategy };
        let p = self.placement(strategy, t.vnodes, &t.kind);
        Ok(Some(
            indexes
                .iter()
                .zip(&shard_keys)
                .map(|(&i, k)| p.owner(t.base + i, k).expect("placement over live members").to_owned())
                .collect(),
        ))
    }

    /// Places the unplaced shards of routed task `id`; returns how many this call placed.
    pub async fn route_task(&mut self, con: &mut Conn, keys: &Keys, id: &str) -> Result<u64> {
        let mut placed = 0;
        loop {
            let (routed, total): (Option<u64>, Option<u64>) =
                redis::cmd("HMGET").arg(keys.task(id)).arg(&["routed", "total"]).query_async(con).await?;
            let (Some(from), Some(total)) = (routed, total) else { return Ok(placed) };
            if from >= total {
                return Ok(placed);
            }
            let to = (from + CHUNK as u64).min(total);
            let indexes: Vec<u64> = (from..to).collect();
            let Some(owners) = self.owners(con, keys, id, &indexes).await? else { return Ok(placed) };
            let owners: Vec<&str> = owners.iter().map(String::as_str).collect();
            self.renew(con).await?;
            match scripts::route(con, keys, id, from, &owners).await {
                Ok(_) => placed += to - from,
                // another router placed this chunk first: read the cursor again
                Err(Error::Script(ScriptCode::RouteMoved | ScriptCode::TaskMissing)) => {}
                // cancelled meanwhile, or not started yet
                Err(Error::Script(ScriptCode::TaskEnded)) => return Ok(placed),
                Err(e) => return Err(e),
            }
        }
    }

    /// Moves refs from the head of list `source` to their owners: all of them (`limit` None, for a
    /// departed node's list or `reroute`), or the first `limit` (a live list being re-placed: a ref
    /// that stays goes to its back). Returns how many were moved to another list.
    pub async fn rehome_list(&mut self, con: &mut Conn, keys: &Keys, source: &str, limit: Option<u64>) -> Result<u64> {
        let (mut done, mut moved) = (0u64, 0u64);
        let mut conflicts = 0;
        loop {
            let want = limit.map_or(CHUNK as u64, |l| (l - done).min(CHUNK as u64));
            if want == 0 {
                return Ok(moved);
            }
            let head: Vec<String> = con.lrange(source, 0, want as isize - 1).await?;
            if head.is_empty() {
                return Ok(moved);
            }
            let dest = self.destinations(con, keys, &head).await?;
            let dest_ref: Vec<&str> = dest.iter().map(String::as_str).collect();
            self.renew(con).await?;
            match scripts::rehome(con, keys, source, &head, &dest_ref).await {
                Ok(n) => {
                    done += n;
                    moved += dest.iter().filter(|d| keys.node_wait(d) != source).count() as u64;
                }
                Err(Error::Script(ScriptCode::HeadChanged)) => {
                    // the owner claimed from the head meanwhile; read again, a few times at most
                    conflicts += 1;
                    if conflicts > 20 {
                        return Ok(moved);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn destinations(&mut self, con: &mut Conn, keys: &Keys, refs: &[String]) -> Result<Vec<String>> {
        // group by task, keep the order
        let mut by_task: HashMap<String, Vec<(usize, u64)>> = HashMap::new();
        let mut dest = vec![self.live[0].clone(); refs.len()];
        for (pos, r) in refs.iter().enumerate() {
            // a malformed or aggregation ref has no owner: any live node takes it (claim drops junk)
            if let Ok(ShardRef { task, job: Job::Shard(i), .. }) = r.parse::<ShardRef>() {
                by_task.entry(task).or_default().push((pos, i));
            }
        }
        for (task, items) in by_task {
            let indexes: Vec<u64> = items.iter().map(|&(_, i)| i).collect();
            if let Some(owners) = self.owners(con, keys, &task, &indexes).await? {
                for ((pos, _), o) in items.into_iter().zip(owners) {
                    dest[pos] = o;
                }
            }
        }
        Ok(dest)
    }
}
