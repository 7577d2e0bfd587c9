//! The README's examples run as written on one host: its shell blocks, executed by bash with the
//! binary under test on the `PATH`, a private redis-server in `SHARDCTL_REDIS` and the repository
//! as the working directory. The executor and the coordinator run together, on their default
//! listeners.

use std::path::Path;
use std::process::{Command, Stdio};

use shardctl_testkit::{tool_available, TestRedis};

/// The code block that follows the first line containing `after` in the README.
fn block_after(readme: &str, after: &str) -> String {
    let from = readme.find(after).unwrap_or_else(|| panic!("the README has no '{after}'"));
    let rest = &readme[from..];
    let open = rest.find("```").expect("a code block");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("a fence line") + 1..];
    body[..body.find("```").expect("a closing fence")].to_owned()
}

/// Runs `script` with bash, stopping at the first failing command; returns stdout and stderr.
fn run(script: &str, redis: &TestRedis) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_BIN_EXE_shardctl")).parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    // a failing command ends the script: its background jobs are stopped too, or they would
    // hold its output open and the test would hang instead of failing
    let script = format!("trap 's=$?; kill $(jobs -p) 2>/dev/null || true; exit $s' EXIT\n{script}");
    let out = Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(root)
        .env("PATH", path)
        .env("SHARDCTL_REDIS", redis.url())
        .env_remove("SHARDCTL_QUEUE")
        .env_remove("SHARDCTL_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    let (so, se) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{script}\nexit {}\n--- stdout\n{so}\n--- stderr\n{se}", out.status);
    (so, se)
}

#[test]
fn the_readme_example_runs_as_written_with_executor_and_coordinator() {
    if !tool_available("python3", &["--version"], "the README's example handler") {
        return;
    }
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let script = block_after(&readme, "## In one example");
    assert!(script.contains("shardctl coordinator &") && script.contains("shardctl executor"), "{script}");
    // and the example's handler takes a task without a payload (its stdin is `null`)
    let extra = "shardctl dispatch --kind report --shards 4 --items 100 --wait\n";
    let at = script.find("shardctl status").unwrap_or_else(|| panic!("no status line: {script}"));
    let script = format!("{}{extra}{}", &script[..at], &script[at..]);
    let redis = TestRedis::start();
    let (out, err) = run(&script, &redis);
    let said = format!("--- stdout\n{out}\n--- stderr\n{err}");
    assert!(out.contains("completed: 200 of 200 shards done, 0 failed"), "{said}");
    assert!(out.contains("completed: 4 of 4 shards done, 0 failed"), "{said}");
    // the rows [0, 1_000_000) whose number is a multiple of 7, summed by the example's handlers
    let picked: Vec<u64> = (0..1_000_000u64).filter(|n| n % 7 == 0).collect();
    let line = out.lines().find_map(|l| l.strip_prefix("result: ")).unwrap_or_else(|| panic!("no result: {said}"));
    let result: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(result["rows"], 1_000_000, "{said}");
    assert_eq!(result["picked"], picked.len(), "{said}");
    assert_eq!(result["sum"], picked.iter().sum::<u64>(), "{said}");
    assert_eq!(result["failed_shards"], serde_json::json!([]), "{said}");
    // status saw both, and both stopped gracefully at the end
    let status = &out[out.find("queue default").unwrap_or_else(|| panic!("no status: {said}"))..];
    assert!(!status.contains("none live"), "the executor or the coordinator was not seen: {said}");
    assert!(err.contains("coordinator stopped") && err.contains("executor stopped"), "{said}");
}

#[test]
fn the_readme_opening_lines_run_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let script = block_after(&readme, "# shardctl");
    assert!(script.contains("shardctl executor") && script.contains("--wait"), "{script}");
    let redis = TestRedis::start();
    // the block leaves its executor running, as one would on a node; the test stops it
    let (out, err) = run(&format!("{script}\nkill %1 && wait\n"), &redis);
    assert!(
        out.contains("completed: 1000 of 1000 shards done, 0 failed") && out.contains(r#"{"primes":664579}"#),
        "{out}\n{err}"
    );
}
