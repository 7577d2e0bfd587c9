//! [`TestCluster`]: a real Redis Cluster of N masters (no replicas) on free ports, made with
//! `redis-cli --cluster create`, ready when every node reports `cluster_state:ok` and knows every
//! other (and replicas their masters); every node killed on drop. Also the checks the cluster tests need: which master owns a
//! slot, a key's slot (`CLUSTER KEYSLOT`), every key of a node, and moving one slot to another
//! master mid-run (the `MIGRATING`/`IMPORTING` protocol, so clients see ASK and then MOVED),
//! and killing a master so that its replica takes over (failover).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::machine::{free_port, temp_dir};

/// A private Redis Cluster, killed on drop.
pub struct TestCluster {
    nodes: Vec<Node>,
    masters: usize,
    dir: PathBuf,
}

struct Node {
    child: Child,
    port: u16,
    alive: bool,
}

impl TestCluster {
    /// Starts `masters` redis-servers in cluster mode (at least 3, as `redis-cli --cluster
    /// create` requires), joins them and waits until the cluster is ok on every node.
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// Like [`TestCluster::start`], with `replicas` replicas per master (for failover tests).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        let dir = temp_dir("cluster");
        let mut c = TestCluster { nodes: Vec::new(), masters, dir };
        for i in 0..masters * (1 + replicas) {
            let node = c.spawn(i);
            c.nodes.push(node);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &c.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: apt-get install -y redis-tools"));
        assert!(out.status.success(), "redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        c.wait_until_ok();
        c
    }

    fn spawn(&self, i: usize) -> Node {
        let dir = self.dir.join(format!("node{i}"));
        std::fs::create_dir_all(&dir).expect("node dir");
        // the bus port is chosen too: port + 10000 (the default) may be taken
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--cluster-port", &bus.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no"])
                // a master whose replicas are frozen would otherwise be given a replica of
                // another master (replica migration), which syncs in full: the loss that
                // `cut_off_replicas` makes certain would be undone
                .args(["--cluster-allow-replica-migration", "no"])
                .args(["--dir", dir.to_str().unwrap(), "--logfile", "redis.log", "--protected-mode", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start redis-server ({e})"));
            let mut node = Node { child, port, alive: true };
            if wait_for_ping(&mut node) {
                return node;
            }
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        panic!("redis-server (cluster node {i}) did not start");
    }

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self.nodes.iter().all(|n| {
                let info: String =
                    redis::cmd("CLUSTER").arg("INFO").query(&mut self.node_con(n.port)).unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && replicas_synced(&mut self.node_con(n.port))
                    && info.contains("cluster_slots_ok:16384")
            });
            let linked = self
                .nodes
                .iter()
                .filter(|n| {
                    let info: String =
                        redis::cmd("INFO").arg("replication").query(&mut self.node_con(n.port)).unwrap_or_default();
                    info.contains("role:slave") && info.contains("master_link_status:up")
                })
                .count();
            if ok && linked == self.nodes.len() - self.masters {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok; logs:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The seed URL shardctl takes: `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The ports of the live masters, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .filter(|n| {
                let info: String =
                    redis::cmd("INFO").arg("replication").query(&mut self.node_con(n.port)).unwrap_or_default();
                info.contains("role:master")
            })
            .map(|n| n.port)
            .collect()
    }

    /// Kills (SIGKILL) the master that owns `slot`; returns its port.
    pub fn kill_owner(&mut self, slot: u16) -> u16 {
        let port = self.owner(slot);
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("owner is a node");
        let _ = node.child.kill();
        let _ = node.child.wait();
        node.alive = false;
        port
    }

    /// The ports of the replicas of the master on `port`, as it lists them.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut self.node_con(port)).expect("INFO");
        // `slave0:ip=127.0.0.1,port=40001,state=online,offset=…`
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains(":ip="))
            .filter_map(|l| l.split(',').find_map(|f| f.strip_prefix("port=")).and_then(|p| p.trim().parse().ok()))
            .collect()
    }

    /// Freezes the replicas of the master on `port` (SIGSTOP) and closes their links on the
    /// master's side (`CLIENT KILL TYPE replica`), so that they cannot catch up: what the master
    /// writes from now on is lost if it dies before [`TestCluster::thaw`] (on one host a replica
    /// is otherwise a few milliseconds behind at most, and a kill seldom loses anything).
    /// Returns the replicas' ports.
    pub fn cut_off_replicas(&self, port: u16) -> Vec<u16> {
        let replicas = self.replicas_of(port);
        for &r in &replicas {
            self.signal_node(r, "STOP");
        }
        let _: u64 =
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query(&mut self.node_con(port)).expect("KILL");
        replicas
    }

    /// SIGCONTs the node on `port` (frozen by [`TestCluster::cut_off_replicas`]).
    pub fn thaw(&self, port: u16) {
        self.signal_node(port, "CONT");
    }

    fn signal_node(&self, port: u16, signal: &str) {
        let node = self.nodes.iter().find(|n| n.port == port && n.alive).expect("a live node");
        let st = Command::new("kill").arg(format!("-{signal}")).arg(node.child.id().to_string()).status();
        assert!(st.is_ok_and(|s| s.success()), "kill -{signal} of the node on {port}");
    }

    /// Waits until a live node owns `slot` again (a replica was promoted) and the cluster is ok
    /// on every live node; returns the new owner.
    pub fn wait_for_failover(&self, slot: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(owner) = self.failed_over(slot) {
                return owner;
            }
            assert!(Instant::now() < deadline, "no failover of slot {slot}; logs:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// [`TestCluster::wait_for_failover`] without the wait: the new owner of `slot` once a live
    /// node owns it and the cluster is ok on every live node, else `None`.
    pub fn failed_over(&self, slot: u16) -> Option<u16> {
        let live: Vec<u16> = self.nodes.iter().filter(|n| n.alive).map(|n| n.port).collect();
        let owner = self.owner(slot);
        let ok = live.iter().all(|&p| {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut self.node_con(p)).unwrap_or_default();
            info.contains("cluster_state:ok")
        });
        (live.contains(&owner) && ok).then_some(owner)
    }

    /// A blocking connection to the node on `port` (no redirections followed).
    pub fn node_con(&self, port: u16) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to a cluster node")
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`); [`key_slot`] computes
    /// it without a cluster.
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.nodes.iter().find(|n| n.alive).expect("a live node").port;
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut self.node_con(port)).expect("KEYSLOT")
    }

    /// The port of the master that owns `slot`, as the first live node sees it.
    pub fn owner(&self, slot: u16) -> u16 {
        let port = self.nodes.iter().find(|n| n.alive).expect("a live node").port;
        // each range: [first, last, [ip, port, id, …], replicas…]
        let ranges: Vec<Vec<redis::Value>> =
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut self.node_con(port)).expect("CLUSTER SLOTS");
        for r in ranges {
            let lo: u16 = redis::from_redis_value(r[0].clone()).expect("first slot");
            let hi: u16 = redis::from_redis_value(r[1].clone()).expect("last slot");
            if (lo..=hi).contains(&slot) {
                let master: Vec<redis::Value> = redis::from_redis_value(r[2].clone()).expect("master");
                return redis::from_redis_value(master[1].clone()).expect("master port");
            }
        }
        panic!("slot {slot} has no owner")
    }

    /// Every key held by the node on `port`.
    pub fn keys_on(&self, port: u16) -> Vec<String> {
        redis::cmd("KEYS").arg("*").query(&mut self.node_con(port)).expect("KEYS")
    }

    fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER").arg("MYID").query(&mut self.node_con(port)).expect("CLUSTER MYID")
    }

    /// Starts moving `slot` to the master on `to`: the target IMPORTING, the owner MIGRATING
    /// (keys not moved yet are served by the owner, the others answered with ASK). Returns the
    /// owner's port.
    pub fn begin_migration(&self, slot: u16, to: u16) -> u16 {
        let from = self.owner(slot);
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        self.setslot(to, slot, "IMPORTING", Some(&from_id));
        self.setslot(from, slot, "MIGRATING", Some(&to_id));
        from
    }

    /// Moves `keys` of a migrating slot from the node on `from` to the node on `to`.
    pub fn move_keys(&self, from: u16, to: u16, keys: &[String]) {
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(&mut self.node_con(from))
            .expect("MIGRATE");
    }

    /// Calls a migration of `slot` off before any key moved: both nodes STABLE, the owner keeps it.
    pub fn abort_migration(&self, slot: u16, from: u16, to: u16) {
        for port in [from, to] {
            self.setslot(port, slot, "STABLE", None);
        }
    }

    fn setslot(&self, port: u16, slot: u16, state: &str, id: Option<&str>) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state);
        if let Some(id) = id {
            cmd.arg(id);
        }
        let () = cmd.query(&mut self.node_con(port)).expect("SETSLOT");
    }

    /// Moves `slot` with its keys to the master on `to`, while clients keep using it: the
    /// source answers ASK for keys already moved, then every node answers MOVED.
    pub fn migrate_slot(&self, slot: u16, to: u16) {
        if self.owner(slot) == to {
            return;
        }
        let from = self.begin_migration(slot, to);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(10)
                .query(&mut self.node_con(from))
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            self.move_keys(from, to, &keys);
        }
        let to_id = self.node_id(to);
        self.setslot(to, slot, "NODE", Some(&to_id));
        self.setslot(from, slot, "NODE", Some(&to_id));
        for n in &self.nodes {
            if n.port != from && n.port != to {
                self.setslot(n.port, slot, "NODE", Some(&to_id));
            }
        }
    }

    /// Every node's log, for panic messages.
    pub fn logs(&self) -> String {
        (0..self.nodes.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("node{i}/redis.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- node {i} ---\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A master sees all its replicas online, a replica has its link to the master up.
fn replicas_synced(con: &mut redis::Connection) -> bool {
    let info: String = redis::cmd("INFO").arg("replication").query(con).unwrap_or_default();
    if info.contains("role:slave") {
        return info.contains("master_link_status:up");
    }
    let want =
        info.lines().find_map(|l| l.strip_prefix("connected_slaves:")).and_then(|v| v.trim().parse::<usize>().ok());
    let online = info.lines().filter(|l| l.starts_with("slave") && l.contains("state=online")).count();
    want == Some(online)
}

fn wait_for_ping(node: &mut Node) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = format!("redis://127.0.0.1:{}", node.port);
    while Instant::now() < deadline {
        if let Ok(mut con) =
            redis::Client::open(url.as_str()).unwrap().get_connection_with_timeout(Duration::from_millis(200))
        {
            if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                return true;
            }
        }
        if let Ok(Some(_)) = node.child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- redis cluster logs ---\n{}", self.logs());
        }
        for n in &mut self.nodes {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub use shardctl_common::slot::{crc16, key_slot};
