//! Cron schedules through the binary: three `shardctl coordinator` processes fire an every-second
//! schedule, each fire time creates exactly one task, executors run them; bad expressions and
//! zones are refused with exit 2 and nothing written.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use support::Cli;

/// The fire time of a task id `<name>-YYYYMMDDTHHMMSSZ`, as seconds since midnight UTC.
fn second_of(id: &str) -> u64 {
    let t = &id[id.len() - 7..id.len() - 1];
    let n = |r: std::ops::Range<usize>| t[r].parse::<u64>().unwrap();
    n(0..2) * 3600 + n(2..4) * 60 + n(4..6)
}

#[test]
fn three_coordinators_fire_each_second_once_and_executors_run_the_tasks() {
    let cli = Cli::start("cron");
    let added = cli.run(&[
        "schedule",
        "add",
        "tick",
        "--cron",
        "* * * * * *",
        "--overlap",
        "allow",
        "--kind",
        "noop",
        "--shards",
        "2",
    ]);
    assert_eq!(added.code(), 0, "{added:?}");
    let out = &added.stdout;
    assert!(out.contains("schedule tick added") && out.contains("next fire"), "{out}");
    // nobody would fire it yet: said at once, and by status
    assert!(added.stderr.contains("no coordinator is running for queue 'cron'"), "{added:?}");
    assert!(cli.ok(&["status"]).contains("coordinators: none live"));
    let mut coordinators: Vec<_> = (0..3)
        .map(|i| {
            cli.background(
                &format!("coordinator-{i}"),
                &["coordinator", "--metrics-addr", "127.0.0.1:0", "--log", "info"],
            )
        })
        .collect();
    let mut executor = cli.executor("cron-exec", &[]);
    support::eventually("status to list the 3 coordinators", Duration::from_secs(30), || {
        let v = cli.json(&["status", "--json"], 0);
        (v["coordinators"].as_array().map(Vec::len) == Some(3)).then_some(()).ok_or(v)
    });
    std::thread::sleep(Duration::from_millis(4_500));
    cli.ok(&["schedule", "remove", "tick"]);
    for c in &mut coordinators {
        assert!(c.terminate().success(), "{}", c.log());
    }
    // a coordinator that stops leaves the list at once
    assert_eq!(cli.json(&["status", "--json"], 0)["coordinators"], serde_json::json!([]));

    let mut ids: Vec<String> = redis::cmd("ZRANGE").arg(cli.key("index")).arg(0).arg(-1).query(&mut cli.con()).unwrap();
    ids.sort();
    assert!(ids.len() >= 3, "about four fire times in 4.5 s: {ids:?}");
    let secs: Vec<u64> = ids.iter().map(|i| second_of(i)).collect();
    assert!(
        secs.windows(2).all(|w| w[1] == w[0] + 1),
        "one task per second, none missing, none twice: {ids:?}\n{}",
        coordinators.iter().map(|c| c.log()).collect::<Vec<_>>().join("\n")
    );
    let fired: usize = coordinators.iter().map(|c| c.log().matches("schedule fired").count()).sum();
    assert_eq!(fired, ids.len(), "each task was created by one coordinator");

    // the executor runs them all to completion
    for id in &ids {
        let v = shardctl_testkit::eventually(&format!("{id} to complete"), Duration::from_secs(20), || {
            let v = cli.json(&["status", id, "--json"], 0);
            if v["state"] == "completed" {
                Ok(v)
            } else {
                Err(format!("{v}\n{}", executor.log()))
            }
        });
        assert_eq!(v["done"], 2);
    }
    executor.terminate();
}

#[test]
fn schedule_commands_refuse_bad_input_and_list() {
    let cli = Cli::start("cron-cli");
    cli.rejects(&["schedule", "add", "x", "--cron", "* * *", "--shards", "1"], 2, "invalid cron expression '* * *'");
    // the schedule's own faults are named even when the task options are incomplete too
    cli.rejects(&["schedule", "add", "x", "--cron", "61 * * * *"], 2, "minute 61 is outside 0-59");
    cli.rejects(&["schedule", "add", "x", "--cron", "@daily", "--tz", "Mars/Base"], 2, "unknown time zone");
    cli.rejects(&["schedule", "add", "x", "--cron", "61 * * * *", "--shards", "1"], 2, "minute 61 is outside 0-59");
    cli.rejects(
        &["schedule", "add", "x", "--cron", "@daily", "--tz", "Mars/Base", "--shards", "1"],
        2,
        "unknown time zone",
    );
    cli.rejects(&["schedule", "add", "x y", "--cron", "@daily", "--shards", "1"], 2, "schedule name");
    cli.rejects(
        &["schedule", "add", "x", "--cron", "@daily", "--shards", "1", "--overlap", "maybe"],
        2,
        "skip or allow",
    );
    cli.rejects(&["schedule", "add", "x", "--cron", "@daily", "--shards", "1", "--misfire", "later"], 2, "run-once");
    cli.rejects(&["schedule", "add", "x", "--cron", "@daily"], 2, "--shards");
    cli.rejects(&["schedule", "add", "x", "--cron", "@daily", "--shards", "1", "--payload", "{"], 2, "JSON");
    cli.rejects(&["schedule", "remove", "nothing"], 1, "no schedule named 'nothing'");

    let out = cli.ok(&["schedule", "add", "nightly", "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--shards", "8"]);
    assert!(out.contains("Europe/Berlin") && out.contains("03:00:00"), "{out}");
    cli.rejects(&["schedule", "add", "nightly", "--cron", "@daily", "--shards", "1"], 2, "--replace");
    let list = cli.ok(&["schedule", "list"]);
    assert!(list.contains("nightly") && list.contains("'0 3 * * *'") && list.contains("8 shards"), "{list}");
    let v = cli.json(&["schedule", "list", "--json"], 0);
    assert_eq!(v[0]["name"], "nightly");
    assert_eq!(v[0]["misfire"], "skip");
    assert!(v[0]["state"]["next_fire_ms"].as_u64().is_some(), "{v}");
    // the task's fields are an object of JSON types, not a list of text pairs
    assert_eq!(v[0]["fields"]["total"], 8, "{v}");
    assert_eq!(v[0]["fields"]["keep_results"], true, "{v}");
    assert_eq!(v[0]["fields"]["kind"], "primes", "{v}");
    cli.ok(&["schedule", "add", "nightly", "--cron", "@hourly", "--shards", "1", "--replace"]);
    assert!(cli.ok(&["schedule", "list"]).contains("@hourly"));
    cli.ok(&["schedule", "remove", "nightly"]);
    assert!(cli.ok(&["schedule", "list"]).contains("no schedules"));
}
