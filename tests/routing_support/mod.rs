//! The harness of tests/routing.rs: executor processes named by node id, one test environment
//! (a private redis-server, the handler and aggregator scripts, the nodes), the owners a
//! placement should give.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use shardctl_common::ring::{Placement, Ring, Strategy, DEFAULT_VNODES};
use shardctl_testkit::TestRedis;

use crate::support::{command, eventually, shardctl, Out, Process};

/// The bound of every "eventually": far above what a healthy run needs.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// The tests run one at a time: each starts several executors, and membership timeouts of one
/// second should not depend on how many other tests share the cores.
pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One `shardctl executor` process, named by its node id.
pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) proc: Process,
}

impl std::ops::Deref for Node {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.proc
    }
}

impl std::ops::DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.proc
    }
}

/// One line of the records file: a node started running a shard.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Run {
    pub(crate) task: String,
    pub(crate) node: String,
    pub(crate) index: u64,
    pub(crate) attempt: u64,
    pub(crate) key: String,
}

/// A private redis-server, a queue, a directory for the handlers' records and the executors.
pub(crate) struct RoutingEnv {
    // dropped first: the executors go before their server
    pub(crate) nodes: Vec<Node>,
    pub(crate) queue: String,
    pub(crate) dir: PathBuf,
    /// What the shard handler sleeps, in seconds (`sleep` argument).
    pub(crate) sleep: &'static str,
    /// The executors' `--member-heartbeat` and `--member-timeout`.
    pub(crate) membership: [&'static str; 2],
    pub(crate) redis: TestRedis,
}

impl RoutingEnv {
    pub(crate) fn start(name: &str, sleep: &'static str) -> Self {
        let dir = std::env::temp_dir().join(format!("shardctl-routing-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        RoutingEnv {
            nodes: Vec::new(),
            queue: format!("routing-{name}"),
            dir,
            sleep,
            membership: ["200ms", "1s"],
            redis: TestRedis::start(),
        }
    }

    pub(crate) fn global(&self) -> Vec<String> {
        vec!["--redis".into(), self.redis.url(), "--queue".into(), self.queue.clone()]
    }

    /// Runs `shardctl --redis URL --queue Q <args>`.
    pub(crate) fn run(&self, args: &[&str]) -> Out {
        let global = self.global();
        let mut all: Vec<&str> = global.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        shardctl(&all)
    }

    pub(crate) fn con(&self) -> redis::Connection {
        self.redis.con()
    }

    /// The full name of key `suffix` of the queue.
    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{{shardctl:{}}}:{suffix}", self.queue)
    }

    pub(crate) fn records_path(&self) -> PathBuf {
        self.dir.join("runs")
    }

    pub(crate) fn aggregations_path(&self) -> PathBuf {
        self.dir.join("aggregations")
    }

    pub(crate) fn exec_line(&self) -> String {
        format!(
            "sh -c 'echo \"$SHARDCTL_TASK_ID $SHARDCTL_NODE_ID $SHARDCTL_SHARD_INDEX $SHARDCTL_ATTEMPT \
             $SHARDCTL_SHARD_KEY\" >> {}; case $SHARDCTL_KIND:$SHARDCTL_ATTEMPT in flaky:1) exit 1;; esac; \
             sleep {}; echo $SHARDCTL_SHARD_INDEX'",
            self.records_path().display(),
            self.sleep
        )
    }

    pub(crate) fn aggregate_line(&self) -> String {
        format!("sh -c \"echo $SHARDCTL_TASK_ID >> {}; wc -l\"", self.aggregations_path().display())
    }

    /// The executor arguments (after the global ones) for node `id`.
    pub(crate) fn executor_args(&self, id: &str) -> Vec<String> {
        let mut args = self.global();
        args.extend(
            [
                "executor",
                "--node-id",
                id,
                "--member-heartbeat",
                self.membership[0],
                "--member-timeout",
                self.membership[1],
                "--lock-duration",
                "1s",
                "--stalled-interval",
                "300ms",
                "--block-timeout",
                "200ms",
                "--concurrency",
                "2",
                "--grace",
                "2s",
            ]
            .map(String::from),
        );
        args.extend(["--exec".to_owned(), self.exec_line(), "--aggregate-exec".to_owned(), self.aggregate_line()]);
        args.extend(["--kinds".to_owned(), "*".to_owned()]);
        args
    }

    /// Starts an executor with node id `id` without keeping it in the environment.
    pub(crate) fn spawn_node(&self, id: &str) -> Node {
        let n = std::fs::read_dir(&self.dir).map(|d| d.count()).unwrap_or(0);
        let log = self.dir.join(format!("executor-{id}-{n}.log"));
        let args = self.executor_args(id);
        let proc = Process::spawn_logging_to(command(&args.iter().map(String::as_str).collect::<Vec<_>>()), &log);
        Node { id: id.to_owned(), proc }
    }

    /// Starts an executor with node id `id`.
    pub(crate) fn node(&mut self, id: &str) {
        let n = self.spawn_node(id);
        self.nodes.push(n);
    }

    pub(crate) fn node_mut(&mut self, id: &str) -> &mut Node {
        self.nodes.iter_mut().rev().find(|n| n.id == id).unwrap_or_else(|| panic!("no executor {id}"))
    }

    /// The node ids in the membership.
    pub(crate) fn members(&self) -> Vec<String> {
        redis::cmd("ZRANGE").arg(self.key("nodes")).arg(0).arg(-1).query(&mut self.con()).unwrap()
    }

    /// Waits until the membership is exactly `ids`.
    pub(crate) fn wait_members(&self, ids: &[&str]) {
        let want: BTreeSet<String> = ids.iter().map(|s| s.to_string()).collect();
        eventually(&format!("the membership is {want:?}"), PATIENCE, || {
            let got: BTreeSet<String> = self.members().into_iter().collect();
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        });
    }

    /// Every shard run recorded so far.
    pub(crate) fn runs(&self) -> Vec<Run> {
        let text = std::fs::read_to_string(self.records_path()).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert!(f.len() >= 4, "malformed record {l:?}");
                let num = |s: &str| s.parse().unwrap_or_else(|_| panic!("malformed record {l:?}"));
                Run {
                    task: f[0].to_owned(),
                    node: f[1].to_owned(),
                    index: num(f[2]),
                    attempt: num(f[3]),
                    key: f.get(4).copied().unwrap_or("").to_owned(),
                }
            })
            .collect()
    }

    pub(crate) fn runs_of(&self, task: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.task == task).collect()
    }

    /// How many times the aggregation of `task` ran.
    pub(crate) fn aggregations(&self, task: &str) -> usize {
        let text = std::fs::read_to_string(self.aggregations_path()).unwrap_or_default();
        text.lines().filter(|l| l.trim() == task).count()
    }

    /// `dispatch --kind mine <args>`, expecting exit 0; returns the run.
    pub(crate) fn dispatch(&self, args: &[&str]) -> Out {
        self.dispatch_kind("mine", args)
    }

    /// `dispatch --kind <kind> <args>`, expecting exit 0; returns the run.
    pub(crate) fn dispatch_kind(&self, kind: &str, args: &[&str]) -> Out {
        let mut all = vec!["dispatch", "--kind", kind];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert_eq!(out.code(), 0, "dispatch {args:?}: {out:?}");
        out
    }

    /// `wait <task> --json`, expecting exit 0 (completed); returns the task.
    pub(crate) fn wait(&self, task: &str) -> Value {
        let out = self.run(&["wait", task, "--timeout", "100s", "--json"]);
        assert_eq!(out.code(), 0, "wait {task}: {out:?}\n{}", self.tails());
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("wait --json is not JSON ({e}): {out:?}"))
    }

    pub(crate) fn task_field(&self, task: &str, field: &str) -> Option<String> {
        redis::cmd("HGET").arg(self.key(&format!("task:{task}"))).arg(field).query(&mut self.con()).unwrap()
    }

    pub(crate) fn list(&self, suffix: &str) -> Vec<String> {
        redis::cmd("LRANGE").arg(self.key(suffix)).arg(0).arg(-1).query(&mut self.con()).unwrap()
    }

    /// Invariants 3 and 4 for a task of `total` shards that ended: completed, every shard counted
    /// once with its result stored, the aggregation run once with every shard's line.
    pub(crate) fn check_completed(&self, t: &Value, total: u64) {
        let task = t["task_id"].as_str().expect("task_id");
        assert_eq!(t["state"], json!("completed"), "{t}");
        assert_eq!(
            (t["total"].clone(), t["done"].clone(), t["failed"].clone()),
            (json!(total), json!(total), json!(0))
        );
        assert_eq!(t["result"], json!(total), "the aggregator counts one line per shard: {t}");
        let mut con = self.con();
        let tkey = self.key(&format!("task:{task}"));
        let (bits, results, errors) = crate::support::task_counts(&mut con, &tkey);
        assert_eq!((bits, results, errors), (total, total, 0), "terminal bits, results, errors of {task}");
        assert_eq!(self.aggregations(task), 1, "the aggregation of {task} ran once");
        let ran: BTreeSet<u64> = self.runs_of(task).iter().map(|r| r.index).collect();
        let all: BTreeSet<u64> = (0..total).collect();
        assert_eq!(ran, all, "every shard of {task} ran");
    }

    /// The last lines of every executor's log.
    pub(crate) fn tails(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            let log = n.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            s.push_str(&format!("----- executor {} (pid {}) log tail:\n{tail}\n", n.id, n.pid()));
        }
        s
    }
}

impl Drop for RoutingEnv {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.tails());
        }
        if std::env::var_os("SHARDCTL_ROUTING_KEEP").is_some() {
            eprintln!("records and logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The owner of shard `index` (key `key`) under `strategy` over `nodes`, as the tests expect it.
pub(crate) fn owner(strategy: Strategy, nodes: &[&str], index: u64, key: &str) -> String {
    Placement::new(strategy, nodes, DEFAULT_VNODES).owner(index, key).expect("a member").to_owned()
}

pub(crate) fn ring_owner(nodes: &[&str], index: u64) -> String {
    Ring::new(nodes, DEFAULT_VNODES).owner(&index.to_string()).expect("a member").to_owned()
}

/// Runs per node, for assertion messages.
pub(crate) fn per_node(runs: &[Run]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in runs {
        *m.entry(r.node.clone()).or_default() += 1;
    }
    m
}
