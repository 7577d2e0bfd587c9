//! `shardctl lock NAME -- CMD`: the command runs under the lock with its fencing token, holders
//! exclude each other, a lost lock kills the command (exit 4), Redlock needs a majority.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shardctl_testkit::TestRedis;

const BIN: &str = env!("CARGO_BIN_EXE_shardctl");

fn lock(redis: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(["--redis", redis, "lock"]).args(args).stdin(Stdio::null()).output().expect("run shardctl")
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
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
    let failing = lock(&url, &["job", "--", "sh", "-c", "exit 7"]);
    assert_eq!(failing.status.code(), Some(7), "the command's exit code is passed on");
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis::cmd("EXISTS").arg("{shardctl:lock:busy}").query::<bool>(&mut r.con()).unwrap() {
        assert!(Instant::now() < deadline, "the holder never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let other = lock(&url, &["busy", "--wait", "200ms", "--", "true"]);
    assert_eq!(other.status.code(), Some(1), "{}", text(&other));
    assert!(text(&other).contains("held by another"), "{}", text(&other));
    assert!(holder.wait().unwrap().success(), "the holder ran its command to the end (renewed past its TTL)");
}

#[test]
fn a_lost_lock_kills_the_command() {
    let r = TestRedis::start();
    let url = r.url();
    let mut holder = Command::new(BIN)
        .args(["--redis", &url, "lock", "lost", "--ttl", "300ms", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis::cmd("EXISTS").arg("{shardctl:lock:lost}").query::<bool>(&mut r.con()).unwrap() {
        assert!(Instant::now() < deadline, "the holder never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    // another process takes the lock over
    let _: () = redis::cmd("SET").arg("{shardctl:lock:lost}").arg("thief").query(&mut r.con()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = holder.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the command was not killed when the lock was lost");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(4));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("was lost"), "{err}");
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
    assert_eq!(refused.status.code(), Some(1), "1 of 3 is no majority: {}", text(&refused));

    let r = &servers[2];
    let bad = lock(&r.url(), &["bad name", "--", "true"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    let missing = lock(&r.url(), &["x", "--", "/nonexistent/cmd"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(text(&missing).contains("cannot start"), "{}", text(&missing));
    let no_cmd = lock(&r.url(), &["x"]);
    assert_eq!(no_cmd.status.code(), Some(2), "{}", text(&no_cmd));
    let few = lock(&r.url(), &["x", "--redlock", "redis://127.0.0.1:1,redis://127.0.0.1:2", "--", "true"]);
    assert_eq!(few.status.code(), Some(2), "{}", text(&few));
}
