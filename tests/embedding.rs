//! The library embedded in a program of its own: `examples/squares.rs` (a custom handler and
//! aggregator on a [`shardctl::Node`], about ten lines of setup) run as two real processes, one
//! SIGKILLed mid-task; the other recovers its shards through the sweep the node runs, and the
//! task ends with the exact sum.

// the harness is shared by every CLI test file: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{Cli, Process};

/// `target/<profile>/examples/squares`, built by `cargo test` with the tests.
fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let path = dir.join("examples").join(name);
    assert!(path.exists(), "{} is not built (cargo test builds the examples)", path.display());
    path
}

fn node(cli: &Cli, id: &str) -> Process {
    let mut cmd = Command::new(example("squares"));
    cmd.env("SHARDCTL_REDIS", cli.redis.url()).env("SHARDCTL_NODE_ID", id).env("SHARDCTL_LOCK_MS", "1500");
    Process::spawn(cmd, id)
}

#[test]
fn an_embedded_node_recovers_a_killed_peers_shards_and_the_sum_is_exact() {
    let cli = Cli::start("default");
    let mut a = node(&cli, "embed-a");
    let mut b = node(&cli, "embed-b");
    let members = cli.key("nodes");
    let start = Instant::now();
    while redis::cmd("ZCARD").arg(&members).query::<u64>(&mut cli.con()).expect("ZCARD") < 2 {
        assert!(start.elapsed() < Duration::from_secs(30), "nodes did not join; logs:\n{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    let items = 100_000u64;
    let slow = cli.ok(&[
        "dispatch",
        "--kind",
        "squares",
        "--shards",
        "60",
        "--items",
        &items.to_string(),
        "--payload",
        r#"{"ms":300}"#,
        "--task-id",
        "slow",
    ]);
    assert!(slow.contains("slow"), "{slow}");
    // kill one node while both hold shards (tokens are `<instance>:<seq>`)
    let active = cli.key("active");
    let start = Instant::now();
    loop {
        let held: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(&active).query(&mut cli.con()).expect("HGETALL");
        let holders: std::collections::HashSet<&str> =
            held.iter().filter(|(r, _)| r.starts_with("slow:")).filter_map(|(_, t)| t.split(':').next()).collect();
        if holders.len() == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "not both nodes hold shards: {held:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.kill();
    // and a task dispatched after the kill runs on the node left
    cli.ok(&["dispatch", "--kind", "squares", "--shards", "100", "--items", &items.to_string(), "--task-id", "after"]);

    let sum = |n: u64| (n - 1) * n * (2 * n - 1) / 6;
    for task in ["slow", "after"] {
        let t = cli.json(&["wait", task, "--timeout", "60s", "--json"], 0);
        assert_eq!(t["result"], serde_json::json!({ "sum": sum(items) }), "{t}\nlog of b:\n{}", b.log());
        assert_eq!(t["failed"], 0, "{t}");
    }
    let events: Vec<(String, Vec<String>)> =
        redis::cmd("XRANGE").arg(cli.key("events")).arg("-").arg("+").query(&mut cli.con()).expect("XRANGE");
    let stalled = events.iter().filter(|(_, f)| f.iter().any(|v| v == "shard_stalled")).count();
    assert!(stalled > 0, "the killed node held shards: the sweep must have recovered some");
    assert!(b.terminate().success(), "log of b:\n{}", b.log());
}
