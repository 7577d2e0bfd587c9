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
    assert!(
        why.contains("outside the protocol on stdout") && why.contains("(print to stderr): debug output, not JSON"),
        "{why}"
    );
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
    assert!(err.contains("Ran 15 tests"), "{err}");
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
    assert!(said.contains("# pass 10") && said.contains("# fail 0"), "{said}");
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

/// A worker's command, as `--worker` takes it.
fn command_of(program: &str, file: &Path) -> String {
    format!("{program} {}", file.display())
}

fn node_lib() -> String {
    format!("{}/clients/node", env!("CARGO_MANIFEST_DIR"))
}

/// Workers that recycle themselves after answering (as gunicorn's `max_requests`): through
/// the Python library (`max_requests=1`), the Node library (`maxRequests: 2`), and a
/// hand-written worker that exits after each answer without saying so. With `--attempts 1`,
/// no shard fails: a worker that exits is replaced before it is given a shard, or, when it
/// exits after the shard was handed to it but before reading it, the shard goes to another
/// worker without failing an attempt.
#[test]
fn workers_that_exit_after_answering_charge_no_attempt() {
    let dir = tempdir("recycle");
    let py = script(&dir, "w.py", "from shardctl_worker import serve\nserve(lambda s: s.index, max_requests=1)\n");
    let js = script(
        &dir,
        "w.js",
        &format!("require({:?}).serve((s) => s.index, undefined, {{ maxRequests: 2 }});\n", node_lib()),
    );
    let raw = raw(
        &dir,
        r#"
def answer(m):
    send({"type": "result", "id": m["id"], "result": m["index"]})
    sys.exit(0)
"#,
    );
    for (name, cmd) in [
        ("python", command_of("python3", &py)),
        ("node", command_of("node", &js)),
        ("raw", command_of("python3", &raw)),
    ] {
        let cli = cli(&format!("workers-recycle-{name}"));
        let ex = cli.executor(name, &["--worker", &cmd, "--concurrency", "2"]);
        let t = cli.json(
            &["dispatch", "--kind", "k", "--shards", "40", "--attempts", "1", "--task-id", name, "--wait", "--json"],
            0,
        );
        assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(40), Some(0)), "{name}: {t}\n{}", ex.log());
    }
}

/// A hand-written worker that numbers its replies itself (from 0): each reply answers no
/// request that runs, so each attempt fails at once, the worker is replaced and the executor
/// says so at WARN; the task ends instead of holding its shards for ever.
#[test]
fn a_reply_with_a_wrong_id_fails_the_attempt_at_once() {
    let dir = tempdir("wrong-id");
    let w = raw(
        &dir,
        r#"
n = [0]
def answer(m):
    send({"type": "result", "id": n[0], "result": m["index"]})
    n[0] += 1
"#,
    );
    let cli = cli("workers-wrong-id");
    let ex = cli.executor("wi", &["--worker", &format!("python3 {}", w.display())]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "4", "--attempts", "1", "--task-id", "w", "--wait", "--json"],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(0), Some(4)), "{t}");
    let why = reasons(&cli, "w");
    assert!(why.iter().all(|r| r.contains("worker answered request 0 while 1 ran")), "{why:?}");
    let log = ex.log();
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains("worker replaced")), "{log}");
}

/// `--worker-silence 2s`: a worker that holds a request with no sign of life (no line, no CPU
/// time: frozen, or its reply stuck in a buffer) is replaced and the attempt fails; one that
/// computes, one that writes on stderr, and a library worker whose handler sleeps (the library
/// sends signs of life) run on past the bound and finish.
#[test]
fn a_worker_with_no_sign_of_life_is_replaced_and_busy_ones_are_not() {
    let dir = tempdir("silence");
    let w = raw(
        &dir,
        r#"
def answer(m):
    i = m["index"]
    if i == 0:
        time.sleep(3600)                      # no line, no CPU: no sign of life
    elif i == 1:
        end = time.time() + 5
        while time.time() < end:              # CPU only
            pass
    elif i == 2:
        for _ in range(10):                   # stderr only
            sys.stderr.write("working\n"); sys.stderr.flush(); time.sleep(0.5)
    send({"type": "result", "id": m["id"], "result": i})
"#,
    );
    let cli = cli("workers-silence");
    let _ex = cli.executor(
        "ws",
        &["--worker", &format!("python3 {}", w.display()), "--concurrency", "3", "--worker-silence", "2s"],
    );
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "3", "--attempts", "1", "--task-id", "s", "--wait", "--json"],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(2), Some(1)), "{t}");
    let why = reasons(&cli, "s");
    assert!(why[0].contains("no sign of life for 2s"), "{why:?}");

    let lib = script(
        &dir,
        "lib.py",
        "import time\nfrom shardctl_worker import serve\ndef h(s):\n    time.sleep(3)\n    return 1\nserve(h)\n",
    );
    let cli = self::cli("workers-silence-lib");
    let _ex = cli.executor("wsl", &["--worker", &format!("python3 {}", lib.display()), "--worker-silence", "1s"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "2", "--attempts", "1", "--task-id", "l", "--wait", "--json"],
        0,
    );
    assert_eq!(t["done"], 2, "{t}");
}

/// A result cut in the middle of a surrogate pair, as JSON.stringify (Node) and json.dumps
/// (a hand-written Python worker) write it: read as U+FFFD, not refused.
#[test]
fn half_a_surrogate_pair_in_a_result_is_read_as_the_replacement_character() {
    let dir = tempdir("surrogate");
    let js = script(
        &dir,
        "w.js",
        &format!(
            r#"
const {{ serve }} = require({:?});
serve((s) => 'report 📈 up'.slice(0, 8), async (a) => {{
  const r = [];
  for await (const o of a.outcomes) r.push(o.result);
  return r;
}});
"#,
            node_lib()
        ),
    );
    let cmd = command_of("node", &js);
    let cli = cli("workers-surrogate");
    let ex = cli.executor("wu", &["--worker", &cmd, "--aggregate-worker", &cmd]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "2", "--attempts", "1", "--task-id", "u", "--wait", "--json"],
        0,
    );
    assert_eq!(t["result"], serde_json::json!(["report \u{fffd}", "report \u{fffd}"]), "{t}\n{}", ex.log());

    let py = raw(
        &dir,
        r#"
def answer(m):
    send({"type": "result", "id": m["id"], "result": "cut \ud83d"})
"#,
    );
    let cli = self::cli("workers-surrogate-py");
    let _ex = cli.executor("wup", &["--worker", &format!("python3 {}", py.display())]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "3", "--attempts", "1", "--task-id", "p", "--wait", "--json"],
        0,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(3), Some(0)), "{t}");
}

/// A `print` before the library is even imported (Python, unbuffered) or required (Node)
/// reaches the protocol's stdout before the hello: the executor logs what it saw, passes it
/// over, and the worker serves.
#[test]
fn output_before_the_hello_is_logged_and_passed_over() {
    let dir = tempdir("banner");
    let py = script(
        &dir,
        "w.py",
        "print('Loading model...', flush=True)\nfrom shardctl_worker import serve\nprint('ready')\nserve(lambda s: s.index)\n",
    );
    let js = script(
        &dir,
        "w.js",
        &format!("console.log('Loading model...');\nrequire({:?}).serve((s) => s.index);\n", node_lib()),
    );
    for (name, cmd) in [("python", command_of("python3", &py)), ("node", command_of("node", &js))] {
        let cli = cli(&format!("workers-banner-{name}"));
        let ex = cli.executor(name, &["--worker", &cmd, "--concurrency", "1"]);
        let t = cli.json(
            &["dispatch", "--kind", "k", "--shards", "5", "--attempts", "1", "--task-id", name, "--wait", "--json"],
            0,
        );
        assert_eq!(t["done"], 5, "{name}: {t}\n{}", ex.log());
        let log = ex.log();
        assert!(
            log.contains("worker wrote on stdout before its hello") && log.contains("passed over: Loading model..."),
            "{name}: {log}"
        );
    }
}

/// Processes named in `marks` (lines `pid N`) that still run.
fn running_pids(marks: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(marks).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("pid "))
        .filter_map(|p| p.trim().parse().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            !stat.is_empty() && !stat.contains(") Z ")
        })
        .collect()
}

/// An executor SIGKILLed mid-shard (the OOM killer): its `--worker` and `--exec` handlers and
/// what they started stop within moments, none finishes the shard it ran, and the executor that
/// runs the shards again finishes each once.
#[test]
fn handlers_stop_when_their_executor_is_sigkilled() {
    let dir = tempdir("orphans");
    // each handler notes its pid and its child's, sleeps 3 s, then notes the shard's end
    let body = r#"
import os, subprocess, time
def work(index, marks):
    open(marks, "a").write("pid %d\nstart %s\n" % (os.getpid(), index))
    child = subprocess.Popen(["sleep", "60"])
    open(marks, "a").write("pid %d\n" % child.pid)
    time.sleep(3)
    open(marks, "a").write("end %s\n" % index)
    return index
"#;
    for kind in ["worker", "exec"] {
        let marks = dir.join(format!("{kind}.marks"));
        let file = if kind == "worker" {
            script(
                &dir,
                "w.py",
                &format!("{body}\nfrom shardctl_worker import serve\nserve(lambda s: work(s.index, {marks:?}))\n"),
            )
        } else {
            script(&dir, "x.py", &format!("{body}\nprint(work(int(os.environ['SHARDCTL_SHARD_INDEX']), {marks:?}))\n"))
        };
        let cmd = format!("python3 {}", file.display());
        let flag = format!("--{kind}");
        let cli = cli(&format!("workers-orphans-{kind}"));
        let mut a = cli.executor(&format!("{kind}-a"), &[&flag, &cmd]);
        cli.ok(&["dispatch", "--kind", "k", "--shards", "2", "--task-id", kind]);
        let read = || std::fs::read_to_string(&marks).unwrap_or_default();
        support::eventually("both shards started", Duration::from_secs(20), || {
            (read().matches("start").count() == 2 && read().matches("pid").count() == 4)
                .then_some(())
                .ok_or_else(|| format!("{}\n{}", read(), a.log()))
        });
        a.kill();
        support::eventually("every handler process of the killed executor gone", Duration::from_secs(3), || {
            let left = running_pids(&marks);
            left.is_empty().then_some(()).ok_or_else(|| format!("{kind}: still running: {left:?}"))
        });
        // past the time a handler would have finished: none did
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(read().matches("end").count(), 0, "{kind}: an orphan finished its shard:\n{}", read());
        let b = cli.executor(&format!("{kind}-b"), &[&flag, &cmd]);
        let t = cli.json(&["wait", kind, "--json"], 0);
        assert_eq!(t["done"], 2, "{kind}: {t}\n{}", b.log());
        for i in 0..2 {
            assert_eq!(read().matches(&format!("end {i}\n")).count(), 1, "{kind}: shard {i}:\n{}", read());
        }
    }
}

/// A hand-written worker whose thread sends signs of life may write one just after the reply it
/// raced (it read the running id, then was preempted): that line is late, not a wrong answer.
#[test]
fn a_sign_of_life_that_comes_just_after_its_reply_is_passed_over() {
    let dir = tempdir("alive-race");
    let w = script(
        &dir,
        "w.py",
        r#"
import sys, json, threading, time
lock, running = threading.Lock(), [None]
def w(s):
    with lock:
        sys.stdout.write(s + "\n"); sys.stdout.flush()
def alive():
    while True:
        rid = running[0]
        if rid is None:
            time.sleep(0.005); continue
        time.sleep(0.1)
        w(json.dumps({"type": "alive", "id": rid}))
threading.Thread(target=alive, daemon=True).start()
w('{"type":"hello","protocol":1}')
for line in sys.stdin:
    m = json.loads(line)
    if m.get("type") != "shard": continue
    running[0] = m["id"]
    time.sleep(0.15)
    running[0] = None
    w(json.dumps({"type": "result", "id": m["id"], "result": m["index"]}))
"#,
    );
    let cli = cli("workers-alive-race");
    let _ex = cli.executor("war", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "1"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "10", "--attempts", "1", "--task-id", "a", "--wait", "--json"],
        0,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(10), Some(0)), "{t}");
}

/// A worker whose handler waits on a child process that computes shows life through the
/// child's CPU time (the worker's whole process group counts), so `--worker-silence` spares it.
#[test]
fn a_worker_busy_in_a_child_process_is_not_taken_for_silent() {
    let dir = tempdir("busy-child");
    let w = raw(
        &dir,
        r#"
import subprocess
def answer(m):
    subprocess.run(["python3", "-c", "import time\nt = time.time()\nwhile time.time() - t < 4: pass"], check=True)
    send({"type": "result", "id": m["id"], "result": m["index"]})
"#,
    );
    let cli = cli("workers-busy-child");
    let _ex = cli.executor("wbc", &["--worker", &format!("python3 {}", w.display()), "--worker-silence", "1s"]);
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "2", "--attempts", "1", "--task-id", "c", "--wait", "--json"],
        0,
    );
    assert_eq!(t["done"], 2, "{t}");
}

/// `max_requests=1` and a cancelled last request: its answer to the cancel says it retires, so
/// it gets no other shard while it winds down (a shard handed to it would fail an attempt).
#[test]
fn a_worker_that_retires_on_a_cancelled_request_gets_no_other_shard() {
    let dir = tempdir("retire-cancel");
    let w = script(
        &dir,
        "w.py",
        r#"
import time
from shardctl_worker import serve
def h(s):
    if s.index % 2 == 0:
        while not s.cancelled():
            time.sleep(0.01)
        raise RuntimeError("stopped")
    return s.index
serve(h, max_requests=1)
time.sleep(0.5)   # cleanup after serve returns, within the 2 s the executor gives
"#,
    );
    let cli = cli("workers-retire-cancel");
    let _ex = cli.executor("wrc", &["--worker", &format!("python3 {}", w.display()), "--concurrency", "2"]);
    let t = cli.json(
        &[
            "dispatch",
            "--kind",
            "k",
            "--shards",
            "8",
            "--attempts",
            "1",
            "--shard-timeout",
            "1s",
            "--task-id",
            "r",
            "--wait",
            "--json",
        ],
        3,
    );
    assert_eq!((t["done"].as_u64(), t["failed"].as_u64()), (Some(4), Some(4)), "{t}");
    let why = reasons(&cli, "r");
    assert!(why.iter().all(|r| r.contains("timed out after 1s")), "only the shards that time out fail: {why:?}");
}

/// An aggregation worker that starts on its request and dies while its outcomes are still
/// being written has started: the attempt is charged, the aggregation is not run again by
/// other workers as if never read.
#[test]
fn an_aggregation_that_started_and_died_is_charged_not_rerun_unseen() {
    let dir = tempdir("agg-crash");
    let runs = dir.join("runs");
    let agg = script(
        &dir,
        "agg.py",
        &format!(
            r#"
import sys, os, json, time
sys.stdout.write('{{"type":"hello","protocol":1}}\n'); sys.stdout.flush()
m = json.loads(sys.stdin.readline())
open({runs:?}, "a").write("started\n")
time.sleep(0.3)
os._exit(1)
"#
        ),
    );
    let shard =
        raw(&dir, "def answer(m):\n    send({\"type\": \"result\", \"id\": m[\"id\"], \"result\": \"x\" * 150})\n");
    let cli = cli("workers-agg-crash");
    let _ex = cli.executor(
        "wac",
        &[
            "--worker",
            &format!("python3 {}", shard.display()),
            "--aggregate-worker",
            &format!("python3 {}", agg.display()),
        ],
    );
    let t = cli.json(
        &["dispatch", "--kind", "k", "--shards", "800", "--attempts", "1", "--task-id", "g", "--wait", "--json"],
        3,
    );
    let started = std::fs::read_to_string(&runs).unwrap_or_default().lines().count();
    assert_eq!(started, 1, "aggregation runs for 1 attempt: {t}");
    assert!(!t["aggregation_error"].to_string().contains("exited before reading"), "{t}");
}
