//! Production Redis settings (issue 7): a redis-server behind a password with an ACL user holding
//! exactly the minimal ACL of docs/operations.md "Production Redis", and the same over TLS with a throwaway CA
//! (`shardctl_testkit::SecureRedis`). Real `shardctl` processes: executor, coordinator (firing a
//! schedule), dispatch (pull, routed, delayed, failing), status, wait, watch, pause/resume, config,
//! limit, cancel, retry, schedule, clean, a task over partitions, the dashboard's map and events. The password never shows in the process list, logs,
//! errors, metrics or `status`; bad credentials and unreadable URL files are clear errors.

#[allow(dead_code)] // shared with tests/cli.rs, which uses all of it
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use shardctl_testkit::SecureRedis;
use shardctl_testkit::{eventually, tool_available};
use support::{shardctl, Cli};

/// The rules of the minimal ACL user, exactly as docs/operations.md "Production Redis" gives
/// them (the test below checks the document holds this line): the queue's keys under the default prefix, no
/// channels, and only the commands shardctl sends or its scripts call.
const MINIMAL_ACL: &str =
    "resetkeys ~{shardctl:* resetchannels -@all +evalsha +script|load +multi +exec +bzpopmin +xread +xrevrange \
+xadd +bitcount +bitfield +del +exists +get +getbit +getrange +hdel +hexists +hget +hgetall +hincrby +hlen +hmget +hmset +hscan +hset \
+hsetnx +hkeys +incr +llen +lpop +lpush +lrange +lrem +ltrim +pexpire +persist +rpush +sadd +scard +set +setbit \
+smembers +srem +time +zadd +zcard +zrange +zrangebyscore +zrem +zremrangebyscore +zrevrange +zscore";

const ADMIN_PASSWORD: &str = "admin-Secret-1";
const PASSWORD: &str = "app-Secret-7f3a";

fn acl_user() -> String {
    format!("shardctl on >{PASSWORD} {MINIMAL_ACL}")
}

/// A file holding `url`, for `--redis-url-file`.
fn url_file(url: &str) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let f = std::env::temp_dir().join(format!("shardctl-auth-test-{}-{seq}.url", std::process::id()));
    std::fs::write(&f, format!("{url}\n")).expect("write url file");
    f
}

fn free_addr() -> String {
    shardctl_testkit::free_addr()
}

/// The whole answer to an HTTP `request` sent to `addr`, or why there is none.
fn answer(addr: &str, request: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// `GET /metrics`, polled until it answers (a guard, not a timing).
fn scrape(addr: &str) -> String {
    eventually(&format!("metrics on {addr}"), Duration::from_secs(30), || {
        let buf = answer(addr, &format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n"))?;
        if buf.contains("shardctl_") {
            Ok(buf)
        } else {
            Err("no shardctl_ series yet".to_owned())
        }
    })
}

/// `GET path` of the dashboard on `addr`: the whole response, once it answers (a guard, not a
/// timing).
fn get(addr: &str, path: &str) -> String {
    eventually(&format!("the dashboard on {addr}"), Duration::from_secs(30), || {
        let buf = answer(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"))?;
        if buf.is_empty() {
            Err("an empty answer".to_owned())
        } else {
            Ok(buf)
        }
    })
}

/// Everything an operator runs, as the minimal ACL user, through `--redis-url-file`; asserts the
/// password shows nowhere. `env` goes to every command (the CA for TLS).
fn run_everything(server: SecureRedis, env: Option<(&str, String)>) {
    let file = url_file(&server.url(Some("shardctl"), PASSWORD));
    let mut cli = Cli::on(server, "unused", "acl").with_redis_args(&["--redis-url-file", file.to_str().unwrap()]);
    if let Some((k, v)) = &env {
        cli = cli.with_env(k, v);
    }
    // a schedule firing every second, and a rate limit every claim goes through
    cli.ok(&["schedule", "add", "tick", "--cron", "* * * * * *", "--shards", "1", "--kind", "noop"]);
    cli.ok(&["limit", "--max", "100000", "--per", "1s"]);
    let metrics = free_addr();
    let mut a = cli.executor("acl-a", &["--metrics-addr", &metrics, "--member-heartbeat", "200ms"]);
    let mut b = cli.executor("acl-b", &["--member-heartbeat", "200ms"]);
    let coordinator_metrics = free_addr();
    let ui = free_addr();
    let mut coordinator = cli.background(
        "coord",
        &["coordinator", "--metrics-addr", &coordinator_metrics, "--ui-addr", &ui, "--refresh", "200ms"],
    );

    // the process list holds the file name, never the URL
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", a.pid())).expect("read cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(PASSWORD), "password in the process list");

    let w = cli.json(&["dispatch", "--shards", "20", "--items", "100000", "--wait", "--json"], 0);
    assert_eq!(w["result"]["primes"], 9592, "{w}");
    let id = w["task_id"].as_str().unwrap().to_owned();
    let r = cli.json(&["dispatch", "--shards", "8", "--strategy", "consistent-hash", "--wait", "--json"], 0);
    assert_eq!((r["done"].as_u64(), r["failed"].as_u64()), (Some(8), Some(0)), "{r}");
    let f = cli.json(
        &["dispatch", "--shards", "2", "--kind", "fail", "--payload", r#"{"rate":1}"#, "--attempts", "2"]
            .iter()
            .chain(&["--backoff", "fixed:50ms", "--wait", "--json"])
            .copied()
            .collect::<Vec<_>>(),
        3,
    );
    assert_eq!(f["failed"].as_u64(), Some(2), "{f}");

    let d = cli.json(&["dispatch", "--shards", "2", "--items", "100", "--delay", "200ms", "--wait", "--json"], 0);
    assert_eq!(d["result"]["primes"], 25, "{d}");
    let sleepy = cli.ok(&["dispatch", "--shards", "2", "--kind", "sleep", "--payload", r#"{"ms":20000}"#]);
    let sleepy = sleepy.trim();
    cli.ok(&["cancel", sleepy]);
    assert_eq!(cli.run(&["wait", sleepy, "--json"]).code(), 4);
    let failed = f["task_id"].as_str().unwrap();
    cli.ok(&["retry", failed]);
    assert_eq!(cli.run(&["wait", failed, "--json"]).code(), 3);
    eventually("the schedule to fire", Duration::from_secs(30), || {
        let log = coordinator.log();
        log.contains("schedule fired").then_some(()).ok_or(log)
    });

    let mut shown = vec![
        cli.ok(&["status"]),
        cli.ok(&["status", "--json"]),
        cli.ok(&["status", &id]),
        cli.ok(&["status", f["task_id"].as_str().unwrap(), "--failed"]),
        cli.ok(&["wait", &id, "--json"]),
        cli.ok(&["watch", "--from-start", "--count", "3", "--json"]),
        cli.ok(&["pause"]),
        cli.ok(&["resume"]),
        cli.ok(&["config", "--events-maxlen", "500"]),
        cli.ok(&["limit"]),
        cli.ok(&["schedule", "list"]),
        cli.ok(&["schedule", "remove", "tick"]),
        cli.ok(&["clean", "--older-than", "0s"]),
        scrape(&metrics),
        scrape(&coordinator_metrics),
    ];
    assert!(shown[0].contains("executors:") && shown[1].contains("acl-a"), "{}", shown[1]);
    // a queue spread over partitions (the schedule is removed: none of its tasks fires over them):
    // the executors follow the change, the aggregation reads every share (BITCOUNT), the
    // dashboard reads the map (GETRANGE) and the merged events (XREVRANGE)
    cli.ok(&["config", "--partitions", "2"]);
    let p = cli.json(&["dispatch", "--shards", "20", "--items", "100000", "--wait", "--json"], 0);
    assert_eq!((p["result"]["primes"].as_u64(), p["partitions"].as_u64()), (Some(9592), Some(2)), "{p}");
    let pid = p["task_id"].as_str().unwrap();
    let map = get(&ui, &format!("/api/tasks/{pid}/map"));
    let events = get(&ui, "/api/events?count=50");
    assert!(map.starts_with("HTTP/1.1 200") && events.starts_with("HTTP/1.1 200"), "{map}\n{events}");
    cli.ok(&["config", "--partitions", "1"]);
    shown.extend([map, events]);

    a.terminate();
    b.terminate();
    coordinator.terminate();
    assert!(a.log().contains("shardctl:***@127.0.0.1"), "the executor logs its redis redacted: {}", a.log());
    shown.extend([a.log(), b.log(), coordinator.log()]);
    for text in &shown {
        assert!(!text.contains(PASSWORD), "the password shows in: {text}");
        assert!(!text.contains("NOPERM"), "the minimal ACL lacks a command: {text}");
    }
    let _ = std::fs::remove_file(file);
}

#[test]
fn the_minimal_acl_user_runs_everything_and_its_password_shows_nowhere() {
    run_everything(SecureRedis::start(ADMIN_PASSWORD, &[&acl_user()], false), None);
}

#[test]
fn tls_with_a_private_ca_runs_everything() {
    if !tool_available("openssl", &["version"], "the TLS test (it makes a throwaway CA)") {
        return;
    }
    let server = SecureRedis::start(ADMIN_PASSWORD, &[&acl_user()], true);
    let url = server.url(Some("shardctl"), PASSWORD);
    // the system roots do not know the throwaway CA: a clear error, exit 1, password hidden
    let out = shardctl(&["--redis", &url, "status"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("cannot connect") && !out.stderr.contains(PASSWORD), "{out:?}");
    // plain text to a TLS port fails too
    let plain = url.replacen("rediss://", "redis://", 1);
    let out = shardctl(&["--redis", &plain, "status"]);
    assert_eq!(out.code(), 1, "{out:?}");
    let ca = server.ca_file().to_str().unwrap().to_owned();
    run_everything(server, Some(("SSL_CERT_FILE", ca)));
}

#[test]
fn the_operations_doc_gives_the_tested_acl() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    assert!(
        doc.contains(MINIMAL_ACL),
        "docs/operations.md \"Production Redis\" must give the tested ACL:\n{MINIMAL_ACL}"
    );
}

#[test]
fn bad_credentials_and_url_files_are_clear_errors() {
    let server = SecureRedis::start(ADMIN_PASSWORD, &[&acl_user()], false);
    for url in [server.url(Some("shardctl"), "wrong-Pass-9"), server.url(None, "wrong-Pass-9")] {
        let out = shardctl(&["--redis", &url, "status"]);
        assert_eq!(out.code(), 1, "{out:?}");
        assert!(out.stderr.contains("cannot connect") && out.stderr.contains("***"), "{out:?}");
        assert!(!out.stderr.contains("wrong-Pass-9"), "password shown: {out:?}");
    }
    // no password at all: one sentence that says what to do
    let out = shardctl(&["--redis", &format!("redis://127.0.0.1:{}", server.port()), "status"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("redis requires authentication"), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    // the ACL user under another prefix than its key pattern allows
    let url = server.url(Some("shardctl"), PASSWORD);
    let out = shardctl(&["--redis", &url, "--prefix", "other", "status"]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert!(out.stderr.contains("lacks a permission") && out.stderr.contains("Production Redis"), "{out:?}");
    // an unreadable or empty URL file is bad usage: exit 2, the file named
    let missing = std::env::temp_dir().join(format!("shardctl-no-such-file-{}", std::process::id()));
    let out = shardctl(&["--redis-url-file", missing.to_str().unwrap(), "status"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("cannot read --redis-url-file"), "{out:?}");
    let empty = url_file("");
    let out = shardctl(&["--redis-url-file", empty.to_str().unwrap(), "status"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("holds no URL"), "{out:?}");
    let _ = std::fs::remove_file(empty);
    let out = shardctl(&["--redis", "redis://x:1", "--redis-url-file", "/dev/null", "status"]);
    assert_eq!(out.code(), 2, "both given: {out:?}");
    assert!(out.stderr.contains("not both"), "{out:?}");
    // the file overrides SHARDCTL_REDIS
    let file = url_file(&server.url(Some("shardctl"), PASSWORD));
    let out = support::command(&["--redis-url-file", file.to_str().unwrap(), "status"])
        .env("SHARDCTL_REDIS", "redis://127.0.0.1:1")
        .output()
        .expect("run shardctl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(file);
}
