//! Durability across a failover (docs/design/durability.md), with real processes on a real
//! Redis Cluster of 4 masters with 2 replicas each (`TestCluster`). Before a master is
//! SIGKILLed its replicas are cut off (frozen, their links closed), so that the one promoted has
//! lost every write since, for certain, not by luck. Each round runs a queue whose home is on a
//! master of its own.
//!
//! With durability `none` the test shows the loss the docs admit: a printed task id that names
//! nothing, and an aggregation handler run twice, as the handler's own record file tells. With
//! `replica` the same faults run the aggregation handler exactly once and keep the result, with
//! the kill before the aggregation's claim, during the handler and after the result. A server
//! that cannot keep a mode refuses it at `config` time.
//!
//! Nothing here asserts an elapsed time: waits poll for a state under a hang guard.

#[allow(dead_code)] // shared with tests/cli.rs, which uses all of it
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use shardctl_testkit::TestCluster;
use support::{lines, script, Cli};

/// How long a state may take to show before the test calls it hung (a guard, not a timing).
const GUARD: Duration = Duration::from_secs(90);
/// Shards of each task.
const SHARDS: u64 = 12;

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    shardctl_testkit::eventually(what, GUARD, || ok().then_some(()).ok_or("not yet"))
}

fn tag(q: &str) -> String {
    format!("{{shardctl:{q}}}")
}

/// One queue per master, in start order: `<stem>-<n>` for the first n whose slot it owns.
fn queues_on_every_master(cluster: &TestCluster, stem: &str) -> Vec<String> {
    let mut by_master = BTreeMap::new();
    for n in 0..5000 {
        let q = format!("{stem}-{n}");
        by_master.entry(cluster.owner(cluster.keyslot(&tag(&q)))).or_insert(q);
        if by_master.len() == cluster.ports().len() {
            return by_master.into_values().collect();
        }
    }
    panic!("no queue names spread over every master");
}

/// One round: a queue, its directory of gates and records, and two executors whose shards wait
/// for the `shards` gate and whose aggregator records each run, then waits for the `agg` gate.
struct Round {
    cli: Cli<()>,
    home_slot: u16,
    dir: PathBuf,
    executors: Vec<support::Process>,
}

impl Round {
    fn start(cluster: &TestCluster, queue: &str, mode: &str) -> Round {
        let cli = Cli::on((), &cluster.url(), queue);
        let dir = std::env::temp_dir().join(format!("shardctl-durability-{}-{queue}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = cli.json(&["config", "--durability", mode, "--json"], 0);
        assert_eq!(cfg["durability"], mode, "{cfg}");
        let shard = script(
            &dir,
            "shard.sh",
            &format!(
                "cat > /dev/null\nwhile [ ! -e {g} ]; do sleep 0.05; done\necho 1",
                g = dir.join("shards").display()
            ),
        );
        let agg = script(
            &dir,
            "agg.sh",
            &format!(
                "cat > /dev/null\necho \"agg $SHARDCTL_TASK_ID $SHARDCTL_DONE\" >> {r}\n\
                 while [ ! -e {g} ]; do sleep 0.05; done\necho '{{\"sum\":'$SHARDCTL_DONE'}}'",
                r = dir.join("runs").display(),
                g = dir.join("agg").display()
            ),
        );
        let executors = ["a", "b"]
            .iter()
            .map(|n| {
                let node = format!("{queue}-{n}");
                #[rustfmt::skip]
                let args = [
                    "executor", "--node-id", &node, "--concurrency", "8",
                    "--exec", &shard, "--aggregate-exec", &agg, "--kinds", "gated",
                    // longer than a failover: a lease the promoted replica has from before the
                    // cut outlives it, so its holder renews it there
                    "--lock-duration", "20s",
                    "--block-timeout", "200ms", "--grace", "2s",
                ];
                cli.background(&node, &args)
            })
            .collect();
        let home_slot = cluster.keyslot(&tag(queue));
        Round { cli, home_slot, dir, executors }
    }

    fn open(&self, gate: &str) {
        std::fs::write(self.dir.join(gate), "").unwrap();
    }

    /// Aggregation runs of task `id`, as the handler itself recorded them.
    fn runs(&self, id: &str) -> usize {
        lines(&self.dir.join("runs")).iter().filter(|l| l.split(' ').nth(1) == Some(id)).count()
    }

    fn dispatch(&self, id: &str) -> support::Out {
        self.cli.run(&["dispatch", "--kind", "gated", "--shards", &SHARDS.to_string(), "--task-id", id])
    }

    /// A field of task `id`'s record as the home's master now has it.
    fn on_master(&self, cluster: &TestCluster, id: &str, field: &str) -> Option<String> {
        let owner = cluster.owner(self.home_slot);
        redis::cmd("HGET")
            .arg(format!("{}:task:{id}", tag(&self.cli.queue)))
            .arg(field)
            .query(&mut cluster.node_con(owner))
            .unwrap()
    }

    /// Whether the home's master holds task `id`'s aggregation job in `active`.
    fn aggregation_claimed(&self, cluster: &TestCluster, id: &str) -> bool {
        let Some(seq) = self.on_master(cluster, id, "seq") else { return false };
        let owner = cluster.owner(self.home_slot);
        let holder: Option<String> = redis::cmd("HGET")
            .arg(format!("{}:active", tag(&self.cli.queue)))
            .arg(format!("{id}:{seq}:agg"))
            .query(&mut cluster.node_con(owner))
            .unwrap();
        holder.is_some()
    }

    fn wait(&self, id: &str) -> Value {
        let out = self.cli.run(&["wait", id, "--json", "--timeout", "120s"]);
        assert_eq!(out.code(), 0, "wait {id}: {out:?}; executors:\n{}", self.logs());
        serde_json::from_str(out.stdout.trim()).unwrap()
    }

    fn logs(&self) -> String {
        self.executors.iter().map(|e| e.log()).collect::<Vec<_>>().join("\n---\n")
    }

    fn end(mut self) {
        for e in &mut self.executors {
            e.terminate();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Cuts the replicas of the master of `round`'s home off, runs `meanwhile` (whatever is written
/// from now on is lost for sure), then SIGKILLs that master, thaws the replicas and waits for
/// one's promotion (cluster-node-timeout 2 s).
fn fail_over_losing(cluster: &mut TestCluster, round: &Round, meanwhile: impl FnOnce(&TestCluster)) {
    let owner = cluster.owner(round.home_slot);
    let replicas = cluster.cut_off_replicas(owner);
    assert_eq!(replicas.len(), 2, "two replicas of :{owner}");
    meanwhile(cluster);
    let dead = cluster.kill_owner(round.home_slot);
    for r in replicas {
        cluster.thaw(r);
    }
    let promoted = cluster.wait_for_failover(round.home_slot);
    assert_ne!(promoted, dead);
}

#[test]
fn a_failover_to_a_lagging_replica_loses_what_none_admits_and_nothing_replica_waited_for() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let queues = queues_on_every_master(&cluster, "dur");

    // --- none: the loss the docs admit ---------------------------------------------------
    // A task dispatched before the cut runs to its end on the doomed master, aggregation
    // included; a second is dispatched after the cut. After the failover the second's printed
    // id names nothing, and the first runs again: its aggregation handler twice.
    let r = Round::start(&cluster, &queues[0], "none");
    assert_eq!(r.dispatch("first").code(), 0);
    wait_until("the first's shards run", || r.on_master(&cluster, "first", "seq").is_some());
    fail_over_losing(&mut cluster, &r, |c| {
        let out = r.dispatch("second");
        assert_eq!((out.code(), out.stdout.trim()), (0, "second"), "none prints the id at once: {out:?}");
        r.open("shards");
        r.open("agg");
        wait_until("the first ended on the doomed master", || {
            r.on_master(c, "first", "state").as_deref() == Some("completed")
        });
        assert_eq!(r.runs("first"), 1);
    });
    let w = r.wait("first");
    assert_eq!((w["state"].as_str(), w["done"].as_u64()), (Some("completed"), Some(SHARDS)), "{w}");
    assert_eq!(r.runs("first"), 2, "none: the aggregation handler ran again after the failover");
    let gone = r.cli.run(&["status", "second", "--json"]);
    assert_ne!(gone.code(), 0, "none: the printed id names nothing after the failover: {gone:?}");
    r.end();

    // --- replica: the kill before the aggregation's claim is durable -----------------------
    // The shards end on the doomed master while no replica acknowledges: the aggregation job is
    // claimed there, but its handler never starts; a dispatch meanwhile prints no id. After the
    // failover the lost completions are recorded again (the executors kept them), the
    // aggregation runs once, and the dispatch whose records were lost fails, saying so.
    let r = Round::start(&cluster, &queues[1], "replica");
    assert_eq!(r.dispatch("before").code(), 0);
    wait_until("its shards run", || r.on_master(&cluster, "before", "seq").is_some());
    let mut pending = None;
    fail_over_losing(&mut cluster, &r, |c| {
        let cli = Cli::on((), &c.url(), &r.cli.queue);
        pending = Some(std::thread::spawn(move || {
            cli.run(&["dispatch", "--kind", "gated", "--shards", "2", "--task-id", "unconfirmed"])
        }));
        // its records are on the doomed master only: lost for certain
        wait_until("the unconfirmed task written on the doomed master", || {
            r.on_master(c, "unconfirmed", "seq").is_some()
        });
        r.open("shards");
        r.open("agg");
        wait_until("the aggregation job claimed on the doomed master", || r.aggregation_claimed(c, "before"));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(r.runs("before"), 0, "replica: no aggregator on a claim no replica has; log:\n{}", r.logs());
        assert!(!pending.as_ref().unwrap().is_finished(), "replica: no id before a replica has the task");
    });
    let w = r.wait("before");
    assert_eq!((w["state"].as_str(), w["done"].as_u64()), (Some("completed"), Some(SHARDS)), "{w}");
    assert_eq!(w["result"]["sum"], SHARDS, "{w}");
    assert_eq!(r.runs("before"), 1, "replica: the aggregation handler ran once; log:\n{}", r.logs());
    let out = pending.unwrap().join().unwrap();
    assert_eq!(out.code(), 1, "the dispatch whose records were lost fails: {out:?}");
    assert!(out.stdout.trim().is_empty(), "and prints no id: {out:?}");
    assert!(
        out.stderr.contains("was lost before it reached a replica") && out.stderr.contains("dispatch it again"),
        "{out:?}"
    );
    let gone = r.cli.run(&["status", "unconfirmed", "--json"]);
    assert_ne!(gone.code(), 0, "{gone:?}");
    r.end();

    // --- replica: the kill during the aggregation handler --------------------------------
    // Its claim is durable, so it started; its result is recorded on the doomed master only.
    // After the failover the executor records it again: the handler is not run again.
    let r = Round::start(&cluster, &queues[2], "replica");
    assert_eq!(r.dispatch("during").code(), 0);
    r.open("shards");
    wait_until("the aggregation handler started", || r.runs("during") == 1);
    fail_over_losing(&mut cluster, &r, |c| {
        r.open("agg");
        wait_until("the result recorded on the doomed master", || {
            r.on_master(c, "during", "state").as_deref() == Some("completed")
        });
    });
    let w = r.wait("during");
    assert_eq!((w["state"].as_str(), w["result"]["sum"].as_u64()), (Some("completed"), Some(SHARDS)), "{w}");
    assert_eq!(r.runs("during"), 1, "replica: the aggregation handler ran once; log:\n{}", r.logs());
    r.end();

    // --- replica: the kill after the result ----------------------------------------------
    // `wait` returned it: no failover takes it back.
    let r = Round::start(&cluster, &queues[3], "replica");
    assert_eq!(r.dispatch("after").code(), 0);
    r.open("shards");
    r.open("agg");
    let w = r.wait("after");
    assert_eq!(w["result"]["sum"], SHARDS, "{w}");
    fail_over_losing(&mut cluster, &r, |_| {});
    let s = r.cli.json(&["status", "after", "--json"], 0);
    assert_eq!((s["state"].as_str(), s["result"]["sum"].as_u64()), (Some("completed"), Some(SHARDS)), "{s}");
    assert_eq!(r.runs("after"), 1);
    let st = r.cli.ok(&["status"]);
    assert!(st.contains("durability: replica"), "{st}");
    r.end();
}

/// `config` refuses a mode the server cannot keep, naming what is missing, and stores nothing.
#[test]
fn a_mode_the_server_cannot_keep_is_refused_at_config_time() {
    let cli = Cli::start("dur-refused");
    let out = cli.run(&["config", "--durability", "replica", "--durability-timeout", "100ms"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("needs a replica's acknowledgement"), "{out:?}");
    assert!(out.stderr.contains("connected replicas of the master of shardctl:dur-refused: 0"), "{out:?}");
    for (args, needle) in [
        (&["config", "--durability", "quorum"][..], "expected none or replica"),
        (&["config", "--durability", "fsync"][..], "needs WAITAOF (Redis 7.2)"),
        (&["config", "--durability", "none", "--durability-timeout", "1m"][..], "expected 10ms to 5s"),
    ] {
        let out = cli.run(args);
        assert_eq!(out.code(), 2, "{args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "{args:?}: {out:?}");
    }
    let cfg = cli.json(&["config", "--json"], 0);
    assert_eq!(
        (cfg["durability"].as_str(), cfg["durability_timeout_ms"].as_u64()),
        (Some("none"), Some(1000)),
        "{cfg}"
    );
    let st = cli.json(&["status", "--json"], 0);
    assert_eq!(st["durability"]["mode"], "none", "{st}");
}

/// Over partitions, a share's entry in its partition's `unreported` is acknowledged only once a
/// confirmation shows the home's count of it on a replica: while the home's replica is cut off,
/// the shares on other masters end and are counted in the home, and their entries stay; once it
/// is back they go, and the task ends exact.
#[test]
fn over_partitions_a_share_is_acknowledged_once_its_count_reached_a_replica() {
    let cluster = TestCluster::start_with_replicas(3, 1);
    let q = "dur-parts";
    let cli = Cli::on((), &cluster.url(), q);
    let cfg = cli.json(&["config", "--partitions", "3", "--durability", "replica", "--json"], 0);
    let tags: Vec<String> =
        cfg["partition_tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    let home_owner = cluster.owner(cluster.keyslot(&tag(q)));
    // the partitions whose master is not the home's: their shares end while the home's replica is away
    let elsewhere: Vec<(String, u16)> = tags
        .iter()
        .map(|t| (t.clone(), cluster.owner(cluster.keyslot(&format!("{{{t}}}")))))
        .filter(|(_, owner)| *owner != home_owner)
        .collect();
    assert!(!elsewhere.is_empty(), "a partition on another master than the home's: {tags:?}");
    let dir = std::env::temp_dir().join(format!("shardctl-durability-parts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gate = dir.join("go");
    let shard = script(
        &dir,
        "shard.sh",
        &format!("cat > /dev/null\nwhile [ ! -e {} ]; do sleep 0.05; done\necho 1", gate.display()),
    );
    let mut executor = cli.executor("parts-a", &["--concurrency", "16", "--exec", &shard]);
    assert_eq!(cli.run(&["dispatch", "--shards", "30", "--task-id", "t"]).code(), 0);
    let frozen = cluster.cut_off_replicas(home_owner);
    std::fs::write(&gate, "").unwrap();
    let count_in_home = |t: &str| -> Option<String> {
        let p = tags.iter().position(|x| x == t).unwrap() + 1;
        redis::cmd("HGET")
            .arg(format!("{}:task:t", tag(q)))
            .arg(format!("part:{p}"))
            .query(&mut cluster.node_con(home_owner))
            .unwrap()
    };
    let pending = |t: &str, owner: u16| -> u64 {
        redis::cmd("ZCARD").arg(format!("{{{t}}}:unreported")).query(&mut cluster.node_con(owner)).unwrap()
    };
    for (t, owner) in &elsewhere {
        wait_until("the share counted in the home", || count_in_home(t).is_some());
        // reports are repeated every 200 ms: several rounds found no replica to confirm the count
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            pending(t, *owner),
            1,
            "partition {t}: acknowledged before a replica had its count; log:\n{}",
            executor.log()
        );
    }
    let st = cli.ok(&["status"]);
    assert!(st.contains("no replica in sync for"), "{st}");
    for r in &frozen {
        cluster.thaw(*r);
    }
    for (t, owner) in &elsewhere {
        wait_until("the share's entry acknowledged", || pending(t, *owner) == 0);
    }
    let w = cli.json(&["wait", "t", "--json", "--timeout", "120s"], 0);
    assert_eq!((w["state"].as_str(), w["done"].as_u64()), (Some("completed"), Some(30)), "{w}");
    // with the home's replica away again, `wait` does not return an end no replica confirms,
    // and its timeout says why
    let frozen = cluster.cut_off_replicas(home_owner);
    let out = cli.run(&["wait", "t", "--timeout", "3s"]);
    for r in &frozen {
        cluster.thaw(*r);
    }
    assert_ne!(out.code(), 0, "{out:?}");
    assert!(out.stderr.contains("it ended (completed), and no replica has confirmed that yet"), "{out:?}");
    executor.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The table's restart rows (docs/operations.md, "What survives a failure"): a Redis restarted
/// without persistence keeps nothing, tasks and settings alike, whatever the durability mode
/// (a restart with the AOF is `tests/runtime.rs::redis_restarted_under_running_executor`).
#[test]
fn a_restart_without_persistence_keeps_nothing() {
    let mut cli = Cli::start("dur-restart");
    cli.ok(&["config", "--events-maxlen", "500"]);
    assert_eq!(cli.ok(&["dispatch", "--shards", "4", "--task-id", "kept"]).trim(), "kept");
    assert_eq!(cli.json(&["status", "kept", "--json"], 0)["state"], "running");
    cli.redis.restart();
    let gone = cli.run(&["status", "kept", "--json"]);
    assert_eq!(gone.code(), 1, "{gone:?}");
    assert!(gone.stderr.contains("no task 'kept'"), "{gone:?}");
    let cfg = cli.json(&["config", "--json"], 0);
    assert_eq!(cfg["events_maxlen"], 10_000, "the settings are gone too: {cfg}");
}
