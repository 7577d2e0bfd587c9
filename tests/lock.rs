//! `shardctl lock NAME -- CMD`: the command runs under the lock with its fencing token, holders
//! exclude each other, a lost lock kills the command's process group (exit 124), a lock not had
//! exits 123, Redlock needs a majority, and SIGTERM/SIGINT/SIGHUP stop the command's whole group
//! and release the lock before shardctl exits 128 + the signal.

// the harness shared by the CLI test files: this one uses a part of it
#[allow(dead_code)]
mod support;

use std::io::BufRead;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use shardctl_testkit::{eventually, signal, TestRedis};
use support::BIN;

fn lock(redis: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(["--redis", redis, "lock"]).args(args).stdin(Stdio::null()).output().expect("run shardctl")
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Whether process group `pgid` has a member that is not a zombie (from /proc: a zombie is dead,
/// only not yet reaped by its new parent).
fn group_alive(pgid: u32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { return false };
        // pid (comm) state ppid pgrp …; comm may hold spaces and parentheses
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
        let f: Vec<&str> = rest.split_whitespace().collect();
        f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
    })
}

fn wait_for_exit(child: &mut Child, what: &str) -> ExitStatus {
    eventually(what, Duration::from_secs(60), || child.try_wait().unwrap().ok_or("still running"))
}

/// Starts `shardctl lock` with its stdout read line by line on a thread; returns the process,
/// the lines, and the process group of the command, which prints `started $$` first.
fn start_holder(url: &str, args: &[&str]) -> (Child, mpsc::Receiver<String>, u32) {
    let mut holder = Command::new(BIN)
        .args(["--redis", url, "lock"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let out = std::io::BufReader::new(holder.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = lines.recv_timeout(Duration::from_secs(30)).expect("the command started");
    let pgid = first.strip_prefix("started ").expect("the command prints its pid first").parse().unwrap();
    (holder, lines, pgid)
}

fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

fn key_exists(r: &TestRedis, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(&mut r.con()).unwrap()
}

#[test]
fn the_command_runs_with_a_rising_fencing_token_and_its_exit_code() {
    let r = TestRedis::start();
    let url = r.url();
    let echo = ["job", "--", "sh", "-c", "echo token=$SHARDCTL_FENCING_TOKEN"];
    let first = lock(&url, &echo);
    assert!(first.status.success(), "{}", text(&first));
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim(), "token=1");
    let second = lock(&url, &echo);
    assert_eq!(String::from_utf8_lossy(&second.stdout).trim(), "token=2");
    for code in [1, 2, 4, 7] {
        let failing = lock(&url, &["job", "--", "sh", "-c", &format!("exit {code}")]);
        assert_eq!(failing.status.code(), Some(code), "the command's exit code is passed on");
        assert!(failing.stderr.is_empty(), "the command's own outcome is not shardctl's: {}", text(&failing));
    }
    let killed = lock(&url, &["job", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(killed.status.code(), Some(128 + 9), "a command killed by signal N: 128 + N, as a shell says");
    // released after each run: the lock key is gone
    let exists: bool = redis::cmd("EXISTS").arg("{shardctl:lock:job}").query(&mut r.con()).unwrap();
    assert!(!exists);
}

#[test]
fn a_held_lock_excludes_another_holder() {
    let r = TestRedis::start();
    let url = r.url();
    let mut holder =
        Command::new(BIN).args(["--redis", &url, "lock", "busy", "--ttl", "2s", "--", "sleep", "3"]).spawn().unwrap();
    eventually("the holder to take the lock", Duration::from_secs(10), || {
        let held: bool = redis::cmd("EXISTS").arg("{shardctl:lock:busy}").query(&mut r.con()).unwrap();
        held.then_some(()).ok_or("not held")
    });
    let other = lock(&url, &["busy", "--wait", "200ms", "--", "true"]);
    assert_eq!(other.status.code(), Some(123), "the lock not had within --wait: {}", text(&other));
    assert!(text(&other).contains("held by another"), "{}", text(&other));
    assert!(holder.wait().unwrap().success(), "the holder ran its command to the end (renewed past its TTL)");
}

#[test]
fn a_lost_lock_kills_the_commands_process_group() {
    let r = TestRedis::start();
    let url = r.url();
    // a background process in the command's group: it must go with the command
    let (mut holder, _lines, pgid) =
        start_holder(&url, &["lost", "--ttl", "300ms", "--", "sh", "-c", "sleep 60 & echo started $$; sleep 60"]);
    assert!(key_exists(&r, "{shardctl:lock:lost}"), "the command runs under the lock");
    // another process takes the lock over
    let _: () = redis::cmd("SET").arg("{shardctl:lock:lost}").arg("thief").query(&mut r.con()).unwrap();
    let status = wait_for_exit(&mut holder, "the command was not killed when the lock was lost");
    assert_eq!(status.code(), Some(124), "the lock lost while the command ran");
    assert!(!group_alive(pgid), "the command's process group outlived the lost lock");
    let err = stderr_of(&mut holder);
    assert!(err.contains("was lost"), "{err}");
    let thief: String = redis::cmd("GET").arg("{shardctl:lock:lost}").query(&mut r.con()).unwrap();
    assert_eq!(thief, "thief", "the release must not delete another holder's lock");
}

/// Issue 11, defect 7: SIGTERM used to kill shardctl alone; the command ran on orphaned while a
/// second `shardctl lock` took the lock. Now the signal goes to the command's whole group, the
/// lock is kept (renewed past its TTL) until nothing of the group is left, then released.
#[test]
fn sigterm_stops_the_commands_whole_group_and_releases_the_lock() {
    let r = TestRedis::start();
    let url = r.url();
    let key = "{shardctl:lock:L9}";
    // the group: sh (the command), a sleep that ignores SIGTERM, and the sleep sh waits for
    let script = "(trap '' TERM; exec sleep 60) & echo started $$; sleep 6; echo first still writing";
    let (mut holder, lines, pgid) =
        start_holder(&url, &["L9", "--ttl", "1s", "--kill-after", "60s", "--", "sh", "-c", script]);
    signal(holder.id(), "TERM");
    // sh ends at SIGTERM; the sleep that ignores it keeps the group, and the lock, alive
    eventually("the command (sh) to end at SIGTERM", Duration::from_secs(30), || {
        assert!(holder.try_wait().unwrap().is_none(), "shardctl exited while the command's group still ran");
        (!std::path::Path::new(&format!("/proc/{pgid}")).exists()).then_some(()).ok_or("sh runs")
    });
    // longer than the TTL: the lock must be renewed while the group is being stopped
    std::thread::sleep(Duration::from_millis(1500));
    assert!(holder.try_wait().unwrap().is_none(), "shardctl exited while the command's group still ran");
    assert!(group_alive(pgid), "the straggler that ignores SIGTERM is still there");
    assert!(key_exists(&r, key), "the lock was given up while the command's group still ran");
    let other = lock(&url, &["L9", "--wait", "0s", "--", "true"]);
    assert_eq!(other.status.code(), Some(123), "a second holder ran beside the first: {}", text(&other));
    // a second signal: SIGKILL for the group at once
    signal(holder.id(), "TERM");
    let status = wait_for_exit(&mut holder, "shardctl did not end after a second SIGTERM");
    assert_eq!(status.code(), Some(128 + 15), "shardctl exits 128 + SIGTERM");
    assert!(!group_alive(pgid), "the command's process group outlived shardctl");
    assert!(!key_exists(&r, key), "the lock was not released");
    let err = stderr_of(&mut holder);
    assert!(err.contains("SIGTERM") && err.contains("released"), "{err}");
    // the first signal said what it waits for and how long; the second what it did
    assert!(
        err.contains("it has 1m to end before SIGKILL") && err.contains("a second signal kills it at once"),
        "{err}"
    );
    assert!(err.contains("SIGKILL to the command's process group"), "{err}");
    // dead members (zombies an init that does not reap keeps) do not count as the group
    assert!(!err.contains("not gone"), "{err}");
    // at once: no --wait needed
    let next = lock(&url, &["L9", "--", "sh", "-c", "echo token=$SHARDCTL_FENCING_TOKEN"]);
    assert!(next.status.success(), "{}", text(&next));
    assert_eq!(String::from_utf8_lossy(&next.stdout).trim(), "token=2");
    // everything that held the first's stdout is gone, so this ends
    let rest: Vec<String> = lines.iter().collect();
    assert!(rest.is_empty(), "the first command wrote after it was stopped: {rest:?}");
}

#[test]
fn sigint_and_sighup_reach_the_command_and_sigkill_follows_the_grace() {
    let r = TestRedis::start();
    let url = r.url();
    // ignores SIGINT (and so does the sleep it starts): SIGKILL after --kill-after
    let deaf = "trap '' INT; echo started $$; sleep 60; echo still writing";
    for (sig, num, script) in [("INT", 2, deaf), ("HUP", 1, "echo started $$; sleep 60; echo still writing")] {
        let (mut holder, lines, pgid) =
            start_holder(&url, &["L10", "--ttl", "2s", "--kill-after", "300ms", "--", "sh", "-c", script]);
        signal(holder.id(), sig);
        let status = wait_for_exit(&mut holder, "shardctl did not stop the command");
        assert_eq!(status.code(), Some(128 + num), "SIG{sig}");
        assert!(!group_alive(pgid), "SIG{sig}: the command's process group outlived shardctl");
        assert!(!key_exists(&r, "{shardctl:lock:L10}"), "SIG{sig}: the lock was not released");
        let err = stderr_of(&mut holder);
        assert!(err.contains(&format!("SIG{sig}")) && !err.contains("not gone"), "{err}");
        assert_eq!(lines.iter().collect::<Vec<_>>(), Vec::<String>::new(), "SIG{sig}");
    }
}

#[test]
fn redlock_needs_a_majority_and_bad_input_is_refused() {
    let mut servers: Vec<TestRedis> = (0..3).map(|_| TestRedis::start()).collect();
    let urls = servers.iter().map(TestRedis::url).collect::<Vec<_>>().join(",");
    let ok = lock(&servers[0].url(), &["red", "--redlock", &urls, "--", "sh", "-c", "echo $SHARDCTL_FENCING_TOKEN"]);
    assert!(ok.status.success(), "{}", text(&ok));
    let first: u64 = String::from_utf8_lossy(&ok.stdout).trim().parse().unwrap();
    servers[0].stop();
    let ok = lock(&servers[1].url(), &["red", "--redlock", &urls, "--", "sh", "-c", "echo $SHARDCTL_FENCING_TOKEN"]);
    assert!(ok.status.success(), "2 of 3 is a majority: {}", text(&ok));
    let second: u64 = String::from_utf8_lossy(&ok.stdout).trim().parse().unwrap();
    assert!(second > first, "fencing tokens rise across Redlock acquisitions: {first} then {second}");
    servers[1].stop();
    let refused = lock(&servers[2].url(), &["red", "--redlock", &urls, "--wait", "300ms", "--", "true"]);
    assert_eq!(refused.status.code(), Some(123), "1 of 3 is no majority: {}", text(&refused));

    // shardctl's own failures: 125, never a code a command commonly uses
    let r = &servers[2];
    let bad = lock(&r.url(), &["bad name", "--", "true"]);
    assert_eq!(bad.status.code(), Some(125), "{}", text(&bad));
    let missing = lock(&r.url(), &["x", "--", "/nonexistent/cmd"]);
    assert_eq!(missing.status.code(), Some(127), "{}", text(&missing));
    assert!(text(&missing).contains("cannot start"), "{}", text(&missing));
    let not_exec = lock(&r.url(), &["x", "--", "/"]);
    assert_eq!(not_exec.status.code(), Some(126), "{}", text(&not_exec));
    let no_cmd = lock(&r.url(), &["x"]);
    assert_eq!(no_cmd.status.code(), Some(125), "{}", text(&no_cmd));
    let unknown = lock(&r.url(), &["x", "--no-such-flag", "--", "true"]);
    assert_eq!(unknown.status.code(), Some(125), "{}", text(&unknown));
    let few = lock(&r.url(), &["x", "--redlock", "redis://127.0.0.1:1,redis://127.0.0.1:2", "--", "true"]);
    assert_eq!(few.status.code(), Some(125), "{}", text(&few));
    let unreachable = lock("redis://127.0.0.1:1", &["x", "--", "true"]);
    assert_eq!(unreachable.status.code(), Some(125), "{}", text(&unreachable));
    // other commands keep exit 2 for bad usage
    let status = Command::new(BIN).args(["status", "--no-such-flag"]).output().unwrap();
    assert_eq!(status.status.code(), Some(2));
}
