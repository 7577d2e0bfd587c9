//! Kinds go only where they are served (docs/design/lanes.md), with real executor
//! processes and Python workers: two executors serving different kinds on one queue each get
//! their own kind's shards only, so each task's result is exact; a kind nobody serves is refused
//! at dispatch, or, queued anyway, waits (saying why) until an executor serving it starts.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::Cli;

fn cli(queue: &str) -> Cli {
    Cli::start(queue).with_env("PYTHONPATH", &format!("{}/clients/python", env!("CARGO_MANIFEST_DIR")))
}

/// A worker that answers kind `kind` only: each result names the kind it was asked for, and its
/// aggregation refuses a result of another kind (what a foreign handler's result would be).
fn worker(name: &str, kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardctl-kinds-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("w.py");
    let body = format!(
        r#"
from shardctl_worker import serve
KIND = "{kind}"
def handle(s):
    if s.kind != KIND:
        raise Exception("asked for kind %s, serves %s" % (s.kind, KIND))
    if KIND.startswith("sq"):
        return {{"kind": s.kind, "v": sum(i * i for i in range(s.start, s.end))}}
    return {{"kind": s.kind, "v": s.end - s.start}}
def aggregate(a):
    total = 0
    for o in a.outcomes:
        if o.result is None or o.result.get("kind") != KIND:
            raise Exception("shard %d has a result of another kind: %r" % (o.shard, o.result))
        total += o.result["v"]
    return {{"v": total}}
serve(handle, aggregate)
"#
    );
    std::fs::write(&p, body).unwrap();
    p
}

fn executor(cli: &Cli, node: &str, kind: &str) -> support::Process {
    let cmd = format!("python3 {}", worker(node, kind).display());
    cli.executor(node, &["--worker", &cmd, "--aggregate-worker", &cmd, "--kinds", kind, "--concurrency", "2"])
}

/// Waits until the live executors announce `kinds` (sorted, comma-joined).
fn announced(cli: &Cli, kinds: &[&str]) {
    support::eventually("the executors joined", Duration::from_secs(20), || {
        let v = cli.json(&["status", "--json"], 0);
        let mut seen: Vec<String> = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["kinds"].as_str().unwrap_or_default().split(',').map(str::to_owned).collect::<Vec<_>>())
            .collect();
        seen.sort();
        seen.dedup();
        let want: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
        if want.iter().all(|k| seen.contains(k)) {
            Ok(())
        } else {
            Err(format!("announced {seen:?}"))
        }
    });
}

#[test]
fn two_executors_serving_different_kinds_each_run_only_their_own() {
    let cli = cli("kinds-mixed");
    let a = executor(&cli, "ka", "sq");
    let b = executor(&cli, "kb", "cnt");
    announced(&cli, &["cnt", "sq"]);
    // both tasks at once, so that each executor could take the other's shards if claims let it
    for (id, kind, items) in [("s", "sq", "100000"), ("c", "cnt", "1000000")] {
        cli.ok(&["dispatch", "--kind", kind, "--task-id", id, "--shards", "100", "--items", items]);
    }
    for id in ["s", "c"] {
        let t = cli.json(&["wait", id, "--timeout", "120s", "--json"], 0);
        assert_eq!(t["state"], "completed", "{t}\n{}\n{}", a.log(), b.log());
        assert_eq!(t["failed"], 0, "{t}");
    }
    let n: u64 = 100_000;
    let s = cli.json(&["status", "s", "--json"], 0);
    assert_eq!(s["result"]["v"], (n - 1) * n * (2 * n - 1) / 6, "{s}");
    let c = cli.json(&["status", "c", "--json"], 0);
    assert_eq!(c["result"]["v"], 1_000_000, "{c}");
    // no shard was taken by the wrong executor and given back or failed there
    for (log, other) in [(a.log(), "cnt"), (b.log(), "sq")] {
        assert!(!log.contains(&format!("asked for kind {other}")), "{log}");
    }
}

#[test]
fn a_kind_nobody_serves_is_refused_or_waits_saying_so_until_served() {
    let cli = cli("kinds-unserved");
    let _a = executor(&cli, "ua", "sq");
    announced(&cli, &["sq"]);
    // a typo is refused before anything is written, naming what is served
    let out = cli.rejects(&["dispatch", "--kind", "sqq", "--shards", "4", "--task-id", "typo"], 2, "no live executor");
    assert!(out.stderr.contains("sq"), "{out:?}");
    cli.rejects(&["status", "typo"], 1, "typo");
    // queued anyway, it waits in its lane: nobody runs it with the wrong handler
    cli.ok(&["dispatch", "--kind", "sqq", "--shards", "4", "--items", "40", "--task-id", "q", "--unserved"]);
    support::eventually("status says why", Duration::from_secs(10), || {
        let v = cli.json(&["status", "q", "--json"], 0);
        let stuck = v["stuck"].to_string();
        if stuck.contains("no live executor serves kind 'sqq'; served: fail, noop, primes, sleep, sq") {
            Ok(v)
        } else {
            Err(format!("{v}"))
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    let v = cli.json(&["status", "q", "--json"], 0);
    assert_eq!(
        (v["done"].as_u64(), v["failed"].as_u64(), v["state"].as_str()),
        (Some(0), Some(0), Some("running")),
        "{v}"
    );
    let text = cli.ok(&["status", "q"]);
    assert!(text.contains("waiting: no live executor serves kind 'sqq'"), "{text}");
    // an executor that serves it comes: the task runs, exactly
    let _b = executor(&cli, "ub", "sqq");
    let t = cli.json(&["wait", "q", "--timeout", "60s", "--json"], 0);
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(t["result"]["v"], (0..40u64).map(|i| i * i).sum::<u64>(), "{t}");
}
