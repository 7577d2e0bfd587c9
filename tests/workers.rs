//! `shardctl executor --worker` (docs/handlers.md, the protocol, version 1) with real worker
//! processes: Python workers through `clients/python` (`shardctl_worker`) and raw-protocol
//! workers written without it, for the failures: a worker that dies, writes outside the
//! protocol or too long a line, hangs past the shard's timeout, or whose command dies at once.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::Cli;

fn python_lib() -> String {
    format!("{}/clients/python", env!("CARGO_MANIFEST_DIR"))
}

/// A Python file `name` in a fresh directory of the test.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardctl-workers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cli(queue: &str) -> Cli {
    Cli::start(queue).with_env("PYTHONPATH", &python_lib())
}

/// The start of a raw-protocol worker: says hello, then answers `answer(msg)` for each shard.
const RAW: &str = r#"
import json, os, sys, time
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
send({"type": "hello", "protocol": 1})
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] != "shard":
        continue
    answer(m)
"#;

fn raw(dir: &Path, answer: &str) -> PathBuf {
    // `answer` is defined first, the loop after
    script(dir, "raw.py", &format!("import json, os, sys, time\n{answer}\n{RAW}"))
}

/// Waits (at most 10 s) until process `pid` has exited (gone, or a zombie nobody reaped yet).
fn gone(what: &str, pid: u32) {
    support::eventually(what, Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            Ok(())
        } else {
            Err(format!("worker {pid} still runs"))
        }
    });
}

fn reasons(cli: &Cli, id: &str) -> Vec<String> {
    let r = cli.json(&["status", id, "--failed", "--json"], 0);
    r.as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap_or_default().to_owned()).collect()
}

#[test]
fn python_workers_run_every_shard_in_few_processes_and_aggregate_once() {
    let dir = tempdir("e2e");
    let w = script(
        &dir,
        "w.py",
        r#"
import os
from shardctl_worker import serve
def handle(s):
    print("shard", s.index, "of", s.task_id)          # goes to the executor's log
    return {"n": s.end - s.start, "pid": os.getpid(), "day": s.payload["day"]}
def aggregate(a):
    rows = [o.result for o in a.outcomes]
    return {"n": sum(r["n"] for r in rows), "pids": len({r["pid"] for r in rows}), "shards": len(rows),
            "days": sorted({r["day"] for r in rows})}
serve(handle, aggregate)
"#,
    );
    let cmd = format!("python3 {}", w.display());
    let cli = cli("workers-e2e");
    let ex = cli.executor("wk", &["--worker", &cmd, "--aggregate-worker", &cmd, "--concurrency", "3"]);
    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "report",
            "--shards",
            "60",
            "--items",
            "100000",
            "--payload",
            r#"{"day":"2026-12-02"}"#,
            "--task-id",
            "r1",
            "--wait",
            "--json",
        ],
        0,
    );
    assert_eq!(t["state"], "completed", "{t}\n{}", ex.log());
    let r = &t["result"];
    assert_eq!(r["n"], 100_000, "{t}");
    assert_eq!(r["shards"], 60, "{t}");
    assert_eq!(r["days"], serde_json::json!(["2026-12-02"]), "{t}");
    // one process per run slot at most, not one per shard
    let pids = r["pids"].as_u64().unwrap();
    assert!((1..=3).contains(&pids), "{pids} worker processes for 60 shards at concurrency 3");
    assert!(ex.log().contains("worker stderr: shard"), "a handler's print() reaches the log:\n{}", ex.log());
}

#[test]
fn a_worker_that_dies_fails_its_shard_with_its_stderr_and_is_replaced() {
    let dir = tempdir("dies");
    let w = raw(
        &dir,
        r#"
def answer(m):
    if m["index"] == 3:
        sys.stderr.write("about to die on shard 3\n"); sys.stderr.flush()
        os._exit(3)
    send({"type": "result", "id": m["id"], "result": m["index"]})
"#,
    );
    let cli = cli("workers-dies");
    let _ex = cli.executor("wd", &["--worker", &format!("python3 {}", w.display())]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "12", "--attempts", "1", "--task-id", "d", "--wait", "--json"],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(11), Some(1)), "{t}");
    let why = reasons(&cli, "d");
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].contains("exited with status 3") && why[0].contains("about to die on shard 3"), "{why:?}");
}

#[test]
fn a_worker_writing_outside_the_protocol_or_too_long_a_line_fails_that_shard() {
    let dir = tempdir("garbage");
    let w = raw(
        &dir,
        r#"
def answer(m):
    if m["index"] == 2:
        sys.stdout.write("debug output, not JSON\n"); sys.stdout.flush()
    elif m["index"] == 4:
        sys.stdout.write('{"type":"result","id":%d,"result":"%s"}\n' % (m["id"], "x" * 200000)); sys.stdout.flush()
    elif m["index"] == 6:
        send({"type": "result", "id": m["id"] + 100, "result": 1})
    else:
        send({"type": "result", "id": m["id"], "result": m["index"]})
"#,
    );
    let cli = cli("workers-garbage");
    let _ex = cli.executor("wg", &["--worker", &format!("python3 {}", w.display()), "--max-result-bytes", "1000"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "10", "--attempts", "1", "--task-id", "g", "--wait", "--json"],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(7), Some(3)), "{t}");
    let why = reasons(&cli, "g").join("\n");
    assert!(why.contains("outside the protocol: debug output, not JSON"), "{why}");
    assert!(why.contains("longer than the result limit"), "{why}");
    assert!(why.contains("answered request"), "{why}");
}

#[test]
fn a_hung_worker_is_stopped_at_the_shard_timeout_with_its_process_group() {
    let dir = tempdir("hung");
    let pidfile = dir.join("hung.pid");
    let w = raw(
        &dir,
        &format!(
            r#"
def answer(m):
    if m["index"] == 1:
        open({pidfile:?}, "w").write(str(os.getpid()))
        time.sleep(3600)   # ignores the cancel
    send({{"type": "result", "id": m["id"], "result": m["index"]}})
"#
        ),
    );
    let cli = cli("workers-hung");
    let _ex = cli.executor("wh", &["--worker", &format!("python3 {}", w.display())]);
    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "k",
            "--shards",
            "6",
            "--attempts",
            "1",
            "--shard-timeout",
            "1s",
            "--task-id",
            "h",
            "--wait",
            "--json",
        ],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(5), Some(1)), "{t}");
    assert!(reasons(&cli, "h")[0].contains("timed out after 1s"), "{:?}", reasons(&cli, "h"));
    // the cancel went unanswered: after its grace the worker is killed
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    gone("the hung worker killed", pid);
}

#[test]
fn a_cancel_reaches_the_worker_which_stops_the_shard() {
    let dir = tempdir("cancel");
    let marks = dir.join("marks");
    let w = script(
        &dir,
        "w.py",
        &format!(
            r#"
import time
from shardctl_worker import serve
def handle(s):
    open({marks:?}, "a").write("started\n")
    while not s.cancelled():
        time.sleep(0.01)
    open({marks:?}, "a").write("cancelled\n")
    raise RuntimeError("stopped")
serve(handle)
"#
        ),
    );
    let cli = cli("workers-cancel");
    let ex = cli.executor("wc", &["--worker", &format!("python3 {}", w.display())]);
    cli.ok(&["dispatch", "--kind", "k", "--shards", "1", "--task-id", "c"]);
    let read = || std::fs::read_to_string(&marks).unwrap_or_default();
    support::eventually("the shard started", Duration::from_secs(20), || {
        read().contains("started").then_some(()).ok_or_else(|| ex.log())
    });
    cli.ok(&["cancel", "c"]);
    support::eventually("the worker saw the cancel", Duration::from_secs(20), || {
        read().contains("cancelled").then_some(()).ok_or_else(|| format!("{}\n{}", read(), ex.log()))
    });
    let t = cli.json(&["status", "c", "--json"], 0);
    assert_eq!(t["state"], "cancelled", "{t}");
}

#[test]
fn a_worker_command_that_dies_at_once_is_paused_not_forked_in_a_loop() {
    let dir = tempdir("broken");
    let starts = dir.join("starts");
    let w = script(&dir, "w.py", &format!("open({starts:?}, 'a').write('x')\nraise SystemExit(1)\n"));
    let cli = cli("workers-broken");
    let ex = cli.executor("wb", &["--worker", &format!("python3 {}", w.display())]);
    cli.ok(&["dispatch", "--kind", "k", "--shards", "40", "--attempts", "1", "--task-id", "b"]);
    // paused, the executor says so and claims none of its kinds until the pause ends
    support::eventually("the command is paused", Duration::from_secs(30), || {
        ex.log().contains("its kinds are not claimed until then").then_some(()).ok_or(ex.log())
    });
    let why = support::eventually("the first shards failed", Duration::from_secs(10), || {
        let why = reasons(&cli, "b");
        if why.iter().any(|r| r.contains("exited with status 1 before its hello")) {
            Ok(why)
        } else {
            Err(format!("{why:?}"))
        }
    });
    // the rest wait (the pause grows, 1 s doubling to 30 s) instead of all failing here
    std::thread::sleep(Duration::from_secs(2));
    let t = cli.json(&["status", "b", "--json"], 0);
    assert_eq!(t["state"], "running", "{t}");
    assert!(t["failed"].as_u64().unwrap() < 40, "every shard failed: {t}\n{why:?}");
    let n = std::fs::read_to_string(&starts).unwrap().len();
    assert!(n < 20, "{n} starts of a command that dies at once, for 40 shards");
    cli.ok(&["cancel", "b"]);
}

#[test]
fn the_python_library_passes_its_own_tests() {
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(format!("{}/tests", python_lib()))
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Ran 10 tests"), "{err}");
}

/// `pip install ./clients/python` as its README says, into a fresh virtualenv (pip fetches the
/// build backend, setuptools, from the Python registry): the module imports from the install,
/// outside the checkout.
#[test]
fn the_python_package_installs_with_pip() {
    let dir = tempdir("pip");
    let venv = dir.join("venv");
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().expect("runs");
        let said =
            format!("{cmd:?}\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{said}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // a copy: setuptools builds in the package's folder (build/, *.egg-info), which must stay
    // out of the checkout
    let src = dir.join("src");
    run(std::process::Command::new("cp").arg("-r").arg(python_lib()).arg(&src));
    let _ = std::fs::remove_dir_all(src.join("tests"));
    run(std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv));
    run(std::process::Command::new(venv.join("bin/pip")).args(["install", "--quiet"]).arg(&src));
    let file = run(std::process::Command::new(venv.join("bin/python"))
        .args(["-c", "import shardctl_worker; print(shardctl_worker.__file__); print(callable(shardctl_worker.serve))"])
        .current_dir(&dir)
        .env_remove("PYTHONPATH"));
    assert!(file.starts_with(venv.to_str().unwrap()) && file.trim_end().ends_with("True"), "{file}");
}

/// `npm install ./clients/node` links the folder into `node_modules` (npm's own rule for a local
/// folder); done by hand here, so that no npm is needed: the package resolves by its name and
/// its `main`, with no dependency to fetch.
#[test]
fn the_node_package_resolves_by_its_name_once_installed() {
    let dir = tempdir("npm");
    let modules = dir.join("node_modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::os::unix::fs::symlink(format!("{}/clients/node", env!("CARGO_MANIFEST_DIR")), modules.join("shardctl-worker"))
        .unwrap();
    let out = std::process::Command::new("node")
        .args(["-e", "const w = require('shardctl-worker'); console.log(typeof w.serve)"])
        .current_dir(&dir)
        .output()
        .expect("node runs");
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.starts_with("function"), "{said}");
    let pkg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/clients/node/package.json", env!("CARGO_MANIFEST_DIR"))).unwrap(),
    )
    .unwrap();
    assert_eq!(pkg["name"], "shardctl-worker");
    assert!(pkg.get("dependencies").is_none(), "no dependencies: {pkg}");
}

#[test]
fn the_node_library_passes_its_own_tests() {
    let out = std::process::Command::new("node")
        .args(["--test"])
        .arg(format!("{}/clients/node/test/", env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("node runs");
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("# pass 6") && said.contains("# fail 0"), "{said}");
}

#[test]
fn a_node_worker_runs_a_task_end_to_end() {
    let dir = tempdir("node");
    let w = script(
        &dir,
        "w.js",
        &format!(
            r#"
const {{ serve }} = require({lib:?});
serve(async (s) => ({{ n: s.end - s.start, pid: process.pid }}), async (a) => {{
  let n = 0; const pids = new Set();
  for await (const o of a.outcomes) {{ n += o.result.n; pids.add(o.result.pid); }}
  return {{ n, pids: pids.size }};
}});
"#,
            lib = format!("{}/clients/node", env!("CARGO_MANIFEST_DIR"))
        ),
    );
    let cmd = format!("node {}", w.display());
    let cli = cli("workers-node");
    let ex = cli.executor("wn", &["--worker", &cmd, "--aggregate-worker", &cmd, "--concurrency", "2"]);
    let t = cli.json(
        &["dispatch", "--kind", "js", "--shards", "30", "--items", "3000", "--task-id", "n1", "--wait", "--json"],
        0,
    );
    assert_eq!(t["state"], "completed", "{t}\n{}", ex.log());
    assert_eq!(t["result"]["n"], 3000, "{t}");
    let pids = t["result"]["pids"].as_u64().unwrap();
    assert!((1..=2).contains(&pids), "{pids} node processes for 30 shards at concurrency 2");
}

#[test]
fn a_worker_that_never_says_hello_fails_the_shard_and_is_killed() {
    let dir = tempdir("mute");
    let pidfile = dir.join("mute.pid");
    let w = script(
        &dir,
        "w.py",
        &format!("import os, time\nopen({pidfile:?}, 'w').write(str(os.getpid()))\ntime.sleep(3600)\n"),
    );
    let cli = cli("workers-mute");
    let _ex = cli.executor("wm", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "1"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "1", "--attempts", "1", "--task-id", "m", "--wait", "--json"],
        3,
    );
    assert_eq!(t["failed"], 1, "{t}");
    let why = reasons(&cli, "m");
    assert!(why[0].contains("worker never said hello within 10s"), "{why:?}");
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    gone("the mute worker killed", pid);
}

#[test]
fn shutdown_lets_a_running_shard_finish_in_its_worker_then_stops_the_workers() {
    let dir = tempdir("grace");
    let marks = dir.join("marks");
    let w = script(
        &dir,
        "w.py",
        &format!(
            r#"
import os, time
from shardctl_worker import serve
open({marks:?}, "a").write("pid %d\n" % os.getpid())
def handle(s):
    open({marks:?}, "a").write("started\n")
    time.sleep(1.5)
    return "finished"
serve(handle)
"#
        ),
    );
    let cli = cli("workers-grace");
    let mut ex = cli.executor("wgr", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "1"]);
    cli.ok(&["dispatch", "--kind", "k", "--shards", "1", "--task-id", "s"]);
    let read = || std::fs::read_to_string(&marks).unwrap_or_default();
    support::eventually("the shard started", Duration::from_secs(20), || {
        read().contains("started").then_some(()).ok_or_else(|| ex.log())
    });
    // SIGTERM: the running shard gets up to --grace (2 s here) and finishes in 1.5 s
    let st = ex.terminate();
    assert_eq!(st.code(), Some(0), "{st:?}\n{}", ex.log());
    // (its aggregation waits for an executor: this one stopped)
    let t = cli.json(&["status", "s", "--json"], 0);
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(1), Some(0)), "{t}\n{}", ex.log());
    // and the worker went with the executor
    let pid: u32 = read().lines().find_map(|l| l.strip_prefix("pid ")).unwrap().parse().unwrap();
    gone("the worker stopped", pid);
}

/// Shards that crash their worker fail, and only they: a worker that said hello and died on a
/// shard is not a command that cannot start, so the other shards are not paused.
#[test]
fn poison_shards_fail_alone_and_do_not_pause_the_command() {
    let dir = tempdir("poison");
    let w = raw(
        &dir,
        r#"
def answer(m):
    if m["index"] < 6:
        os._exit(1)
    send({"type": "result", "id": m["id"], "result": m["index"]})
"#,
    );
    let cli = cli("workers-poison");
    let _ex = cli.executor("wp", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "1"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "12", "--attempts", "1", "--task-id", "p", "--wait", "--json"],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(6), Some(6)), "{t}");
    let why = reasons(&cli, "p");
    assert!(why.iter().all(|r| r.contains("exited with status 1 while running the shard")), "{why:?}");
}

/// A worker that answers late (after its shard's timeout) and then answers the cancel too,
/// as the protocol allows: the stale lines are passed over, the next shards run.
#[test]
fn a_late_answer_after_a_cancel_does_not_fail_the_next_shard() {
    let dir = tempdir("late");
    let w = raw(
        &dir,
        r#"
def answer(m):
    if m["index"] == 0:
        time.sleep(1.2)
        send({"type": "result", "id": m["id"], "result": "late"})
        # then it reads the cancel that came meanwhile, and answers it
        c = json.loads(sys.stdin.readline())
        send({"type": "error", "id": c["id"], "error": "cancelled"})
        return
    send({"type": "result", "id": m["id"], "result": m["index"]})
"#,
    );
    let cli = cli("workers-late");
    let _ex = cli.executor("wl", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "1"]);
    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "k",
            "--shards",
            "3",
            "--attempts",
            "1",
            "--shard-timeout",
            "1s",
            "--task-id",
            "l",
            "--wait",
            "--json",
        ],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(2), Some(1)), "{t}");
    assert!(reasons(&cli, "l")[0].contains("timed out after 1s"), "{:?}", reasons(&cli, "l"));
}
