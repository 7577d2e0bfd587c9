//! Every `--json` output of the CLI against the JSON Schema that documents it in docs/schemas
//! (issue 14, finding 7). The commands run as real processes against a private redis-server,
//! with real executors, a coordinator and the bench, so that the outputs are the real ones in
//! every shape they take (a task waiting, delayed, routed, cancelled, completed with a result,
//! failed with failed shards; every kind of event). Each schema file is itself checked (the
//! draft 2020-12 meta-schema, it compiles, every field described, listed in the README), and each
//! schema must reject a wrong value taken from a real output, so that no check passes vacuously.

#[allow(dead_code)] // each test file uses a part of the harness
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, shardctl, Cli};

/// Every schema in docs/schemas, by name (`<name>.schema.json`).
const SCHEMAS: &[&str] = &["dispatch", "task", "status", "failed", "watch-event", "schedule-list", "config", "bench"];

/// How long a step that waits for executors, sweeps or a coordinator may take at most.
const PATIENCE: Duration = Duration::from_secs(60);

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join("schemas")
}

/// The URI the schemas are read under: `$ref: "task.schema.json"` resolves next to its file.
fn base_uri() -> String {
    format!("file://{}/", schema_dir().display())
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Serves the `$ref`s between the schemas from docs/schemas and nothing else: no network, no
/// other file.
struct SchemaDir;

impl jsonschema::Retrieve for SchemaDir {
    fn retrieve(&self, uri: &jsonschema::Uri<String>) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let base = base_uri();
        let file = uri
            .as_str()
            .strip_prefix(&base)
            .filter(|f| f.ends_with(".schema.json") && !f.contains('/'))
            .ok_or_else(|| format!("{uri}: not a schema of docs/schemas"))?;
        Ok(serde_json::from_str(&std::fs::read_to_string(schema_dir().join(file))?)?)
    }
}

/// One compiled schema.
struct Schema {
    name: &'static str,
    validator: jsonschema::Validator,
}

impl Schema {
    /// Reads docs/schemas/`name`.schema.json, checks it against the draft 2020-12 meta-schema
    /// and compiles it.
    fn load(name: &'static str) -> Self {
        let file = format!("{name}.schema.json");
        let schema = read_json(&schema_dir().join(&file));
        if let Err(e) = jsonschema::draft202012::meta::validate(&schema) {
            panic!("{file} is not a valid draft 2020-12 schema: {e} (at {})", e.instance_path());
        }
        let validator = jsonschema::draft202012::options()
            .with_base_uri(format!("{}{file}", base_uri()))
            .with_retriever(SchemaDir)
            .build(&schema)
            .unwrap_or_else(|e| panic!("{file} does not compile: {e}"));
        Schema { name, validator }
    }

    /// What is wrong with `v`, one line per error with where it is.
    fn errors(&self, v: &Value) -> Vec<String> {
        self.validator.iter_errors(v).map(|e| format!("at '{}': {e}", e.instance_path())).collect()
    }

    /// Panics unless `v`, the output of `what`, is valid.
    fn check(&self, what: &str, v: &Value) {
        let errors = self.errors(v);
        assert!(
            errors.is_empty(),
            "{what}: the output does not match docs/schemas/{}.schema.json:\n  {}\noutput: {v}",
            self.name,
            errors.join("\n  ")
        );
    }

    /// Panics unless the schema rejects `v`: a valid output with one thing made wrong (`change`).
    fn rejects(&self, change: &str, v: &Value) {
        assert!(!self.validator.is_valid(v), "{}.schema.json accepts {change}: {v}", self.name);
    }
}

/// `v` with `f` applied: a copy of a real output, made wrong in one place.
fn changed(v: &Value, f: impl FnOnce(&mut Value)) -> Value {
    let mut v = v.clone();
    f(&mut v);
    v
}

/// `v` with `field` of the object at `pointer` removed.
fn without(v: &Value, pointer: &str, field: &str) -> Value {
    changed(v, |v| {
        v.pointer_mut(pointer).and_then(Value::as_object_mut).expect("an object").remove(field);
    })
}

/// `v` with `value` at `pointer` (which must exist).
fn with(v: &Value, pointer: &str, value: Value) -> Value {
    assert!(v.pointer(pointer).is_some(), "no {pointer} in {v}");
    changed(v, |v| *v.pointer_mut(pointer).expect("checked") = value)
}

/// `a` then `b`: a command line from two parts.
fn cat<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    [a, b].concat()
}

/// The kinds of the events in the queue's event log, oldest first.
fn logged_events(cli: &Cli) -> Vec<String> {
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(cli.key("events")).arg("-").arg("+").query(&mut cli.con()).expect("XRANGE events");
    entries.into_iter().map(|(_, f)| f.get("event").cloned().unwrap_or_default()).collect()
}

/// Waits until the event log holds an event of `kind`.
fn await_event(cli: &Cli, kind: &str) {
    eventually(&format!("a {kind} event"), PATIENCE, || {
        let kinds = logged_events(cli);
        if kinds.iter().any(|k| k == kind) {
            Ok(())
        } else {
            Err(format!("{kinds:?}"))
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The schema files themselves

/// Walks a schema: every object schema with `properties` lists its always-present fields in
/// `required`, allows no other field (unless its `allOf` branches say which, as the watch
/// event's do), and every field has a description (or is a bare `$ref` to a described
/// definition).
fn lint(file: &str, at: &str, s: &Value, problems: &mut Vec<String>) {
    match s {
        Value::Object(o) => {
            if let Some(Value::Object(props)) = o.get("properties") {
                if !o.contains_key("allOf") && o.get("additionalProperties") != Some(&json!(false)) {
                    problems
                        .push(format!("{file} {at}: an object with properties needs \"additionalProperties\": false"));
                }
                if !o.contains_key("required") {
                    problems.push(format!("{file} {at}: an object with properties needs \"required\""));
                }
                for (name, p) in props {
                    let bare_ref = p.get("$ref").is_some() && p.as_object().is_some_and(|p| p.len() == 1);
                    if p.get("description").and_then(Value::as_str).is_none_or(str::is_empty) && !bare_ref {
                        problems.push(format!("{file} {at}/properties/{name}: no description"));
                    }
                }
                if let Some(Value::Array(required)) = o.get("required") {
                    for r in required {
                        if !props.contains_key(r.as_str().unwrap_or_default()) {
                            problems.push(format!("{file} {at}: required {r} is not among the properties"));
                        }
                    }
                }
            }
            if let Some(t) = o.get("type") {
                if t == "number" && at.ends_with("_ms") {
                    problems.push(format!("{file} {at}: a time in ms is an integer"));
                }
            }
            // an `if` is a condition on the output, not a description of it
            for (k, v) in o.iter().filter(|(k, _)| k.as_str() != "if") {
                lint(file, &format!("{at}/{k}"), v, problems);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                lint(file, &format!("{at}/{i}"), v, problems);
            }
        }
        _ => {}
    }
}

#[test]
fn every_schema_is_valid_documented_and_listed() {
    let mut on_disk: BTreeSet<String> = BTreeSet::new();
    for entry in std::fs::read_dir(schema_dir()).expect("docs/schemas") {
        let name = entry.expect("a directory entry").file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".schema.json") {
            on_disk.insert(stem.to_owned());
        }
    }
    let tested: BTreeSet<String> = SCHEMAS.iter().map(|s| s.to_string()).collect();
    assert_eq!(on_disk, tested, "every schema in docs/schemas is loaded by this test, and only those");

    let readme = std::fs::read_to_string(schema_dir().join("README.md")).expect("docs/schemas/README.md");
    let mut problems = Vec::new();
    for name in SCHEMAS {
        let file = format!("{name}.schema.json");
        let s = read_json(&schema_dir().join(&file));
        assert_eq!(s["$schema"], json!("https://json-schema.org/draft/2020-12/schema"), "{file}: $schema");
        assert!(s.get("$id").is_none(), "{file}: no $id (the file's own place is its id)");
        for key in ["title", "description"] {
            assert!(s[key].as_str().is_some_and(|t| !t.is_empty()), "{file}: no {key}");
        }
        assert!(readme.contains(&format!("]({file})")), "docs/schemas/README.md does not list {file}");
        lint(&file, "#", &s, &mut problems);
        // the meta-schema, and a compile (every $ref resolved)
        Schema::load(name);
    }
    assert!(problems.is_empty(), "schema problems:\n  {}", problems.join("\n  "));

    // the lint itself finds what it looks for
    let loose = json!({ "type": "object", "properties": { "n": { "type": "number" }, "at_ms": { "type": "number" } } });
    let mut found = Vec::new();
    lint("loose", "#", &loose, &mut found);
    assert_eq!(found.len(), 5, "additionalProperties, required, two descriptions, a time as a number: {found:?}");
}

// ---------------------------------------------------------------------------------------------
// dispatch, status TASK, wait, status TASK --failed, status

#[test]
fn dispatch_wait_and_status_outputs_match_their_schemas() {
    let dispatch = Schema::load("dispatch");
    let task = Schema::load("task");
    let failed = Schema::load("failed");
    let status = Schema::load("status");
    let cli = Cli::start("schema-tasks");

    status.check("status --json (an empty queue)", &cli.json(&["status", "--json"], 0));

    // tasks no executor runs yet: waiting, delayed, routed, and one cancelled
    let d = cli.json(&["dispatch", "--shards", "3", "--task-id", "waiting", "--json"], 0);
    dispatch.check("dispatch --json", &d);
    assert_eq!(d, json!({ "task_id": "waiting" }));
    dispatch.check("dispatch --json", &cli.json(&["dispatch", "--shards", "2", "--json"], 0));
    let args = ["dispatch", "--shards", "2", "--kind", "noop", "--task-id", "later", "--delay", "1h", "--json"];
    dispatch.check("dispatch --delay --json", &cli.json(&args, 0));
    let args = ["dispatch", "--shards", "4", "--kind", "noop", "--strategy", "consistent-hash", "--task-id", "routed"];
    dispatch.check("dispatch --strategy consistent-hash --json", &cli.json(&cat(&args, &["--json"]), 0));
    let args = ["dispatch", "--shards", "2", "--kind", "noop", "--task-id", "dropped", "--retain", "forever"];
    cli.ok(&args);
    cli.ok(&["cancel", "dropped"]);

    let waiting = cli.json(&["status", "waiting", "--json"], 0);
    task.check("status TASK --json (running)", &waiting);
    assert_eq!(
        (&waiting["state"], &waiting["routed"], &waiting["finished_ms"]),
        (&json!("running"), &json!(null), &json!(null))
    );
    let later = cli.json(&["status", "later", "--json"], 0);
    task.check("status TASK --json (delayed)", &later);
    assert!(later["state"] == "delayed" && later["start_ms"].is_u64(), "{later}");
    let routed = cli.json(&["status", "routed", "--json"], 0);
    task.check("status TASK --json (routed)", &routed);
    assert!(routed["routed"].is_u64(), "{routed}");
    let dropped = cli.json(&["status", "dropped", "--json"], 0);
    task.check("status TASK --json (cancelled)", &dropped);
    assert!(
        dropped["state"] == "cancelled" && dropped["finished_ms"].is_u64() && dropped["retain_ms"] == 0,
        "{dropped}"
    );
    let none = cli.json(&["status", "waiting", "--failed", "--json"], 0);
    failed.check("status TASK --failed --json (none failed)", &none);
    assert_eq!(none, json!([]));

    // an executor runs tasks to their end: completed with a result, failed with failed shards
    let _executor = cli.executor("schema-exec", &[]);
    let args = ["dispatch", "--shards", "10", "--items", "10000", "--task-id", "primes", "--wait", "--json"];
    let done = cli.json(&args, 0);
    task.check("dispatch --wait --json (completed)", &done);
    assert_eq!((&done["state"], &done["result"]), (&json!("completed"), &json!({ "primes": 1229 })), "{done}");
    assert!(done["finished_ms"].is_u64(), "{done}");
    task.check("wait --json (completed)", &cli.json(&["wait", "primes", "--json"], 0));
    task.check("status TASK --json (completed)", &cli.json(&["status", "primes", "--json"], 0));

    let payload = r#"{"rate":1.0}"#;
    let args =
        ["dispatch", "--shards", "3", "--kind", "fail", "--payload", payload, "--attempts", "1", "--task-id", "bad"];
    let bad = cli.json(&cat(&args, &["--wait", "--json"]), 3);
    task.check("dispatch --wait --json (failed)", &bad);
    assert_eq!((&bad["state"], &bad["failed"]), (&json!("failed"), &json!(3)), "{bad}");
    let shards = cli.json(&["status", "bad", "--failed", "--json"], 0);
    failed.check("status TASK --failed --json", &shards);
    assert_eq!(shards.as_array().map(Vec::len), Some(3), "{shards}");
    // a retried task (it fails again); `retried_ms` is an integer once the field exists
    cli.ok(&["retry", "bad"]);
    let again = cli.json(&["wait", "bad", "--json"], 3);
    task.check("wait --json (failed again after a retry)", &again);
    task.check("status TASK --json (after a retry)", &cli.json(&["status", "bad", "--json"], 0));

    // the queue with a live executor and tasks in several states
    let queue = eventually("status to list the executor", PATIENCE, || {
        let q = cli.json(&["status", "--json"], 0);
        if q["nodes"].as_array().map(Vec::len) == Some(1) {
            Ok(q)
        } else {
            Err(q)
        }
    });
    status.check("status --json", &queue);
    assert!(queue["recent"].as_array().is_some_and(|r| r.len() >= 5), "{queue}");
    assert!(queue["nodes"][0]["pid"].is_u64() && queue["nodes"][0]["concurrency"].is_u64(), "{queue}");

    // each schema rejects a wrong value: a number as text, a missing field, an undocumented one
    dispatch.rejects("a task id that is a number", &json!({ "task_id": 7 }));
    dispatch.rejects("an undocumented field", &json!({ "task_id": "x", "queue": "q" }));
    dispatch.rejects("no task id", &json!({}));
    task.rejects("a count as text", &with(&done, "/total", json!("10")));
    task.rejects("a time as text", &with(&done, "/finished_ms", json!(done["finished_ms"].to_string())));
    task.rejects("a flag as a number", &with(&done, "/keep_results", json!(1)));
    task.rejects("an unknown state", &with(&done, "/state", json!("done")));
    task.rejects("a missing field instead of null", &without(&waiting, "", "finished_ms"));
    task.rejects("an undocumented field", &changed(&done, |v| v["bogus"] = json!(1)));
    task.rejects("retried_ms as text", &changed(&done, |v| v["retried_ms"] = json!("1")));
    failed.rejects("a shard index as text", &with(&shards, "/0/shard", json!("0")));
    failed.rejects("an object instead of an array", &shards[0]);
    status.rejects("a count as text", &with(&queue, "/waiting", json!("0")));
    status.rejects("a pid as text", &with(&queue, "/nodes/0/pid", json!("123")));
    status.rejects("a task count of an unknown state", &with(&queue, "/tasks", json!({ "sleeping": 1 })));
    // through the $ref to task.schema.json
    status.rejects("a recent task's count as text", &with(&queue, "/recent/0/total", json!("10")));
}

// ---------------------------------------------------------------------------------------------
// config, schedule list, status with a coordinator, watch

#[test]
fn config_schedule_list_and_watch_events_match_their_schemas() {
    let config = Schema::load("config");
    let schedules = Schema::load("schedule-list");
    let status = Schema::load("status");
    let event = Schema::load("watch-event");
    let cli = Cli::start("schema-events");

    let c = cli.json(&["config", "--json"], 0);
    config.check("config --json", &c);
    let c = cli.json(&["config", "--events-completions", "on", "--json"], 0);
    config.check("config --events-completions on --json", &c);
    assert_eq!(c["events_completions"], json!(true), "{c}");
    config.rejects("a count as text", &with(&c, "/events_maxlen", json!("10000")));
    config.rejects("a flag as a number", &with(&c, "/paused", json!(0)));
    config.rejects("a missing field", &without(&c, "", "queue"));

    let none = cli.json(&["schedule", "list", "--json"], 0);
    schedules.check("schedule list --json (none)", &none);
    assert_eq!(none, json!([]));
    // `tick` fires each second; its first task stays unrun (no executor yet), so later fire times
    // overlap; `late` is always handled later than its 1 ms grace, so its fire times are missed
    let tick = [
        "schedule",
        "add",
        "tick",
        "--cron",
        "* * * * * *",
        "--kind",
        "noop",
        "--shards",
        "2",
        "--payload",
        r#"{"n":1,"tag":"x"}"#,
        "--priority",
        "5",
        "--attempts",
        "2",
        "--backoff",
        "fixed:10ms",
        "--shard-timeout",
        "10s",
        "--retain",
        "forever",
    ];
    cli.ok(&tick);
    let late = ["schedule", "add", "late", "--cron", "* * * * * *", "--misfire-grace", "1ms", "--kind", "noop"];
    cli.ok(&cat(&late, &["--shards", "1", "--strategy", "round-robin", "--overlap", "allow"]));
    schedules.check("schedule list --json (never fired)", &cli.json(&["schedule", "list", "--json"], 0));

    let mut coordinator = cli.background("schema-coordinator", &["coordinator", "--metrics-addr", "127.0.0.1:0"]);
    await_event(&cli, "schedule_overlap");
    await_event(&cli, "schedule_missed");
    let queue = eventually("status to list the coordinator", PATIENCE, || {
        let q = cli.json(&["status", "--json"], 0);
        if q["coordinators"].as_array().map(Vec::len) == Some(1) {
            Ok(q)
        } else {
            Err(q)
        }
    });
    status.check("status --json (a coordinator live)", &queue);
    status.rejects("a coordinator that is not a string", &with(&queue, "/coordinators/0", json!(1)));
    let list = cli.json(&["schedule", "list", "--json"], 0);
    schedules.check("schedule list --json", &list);
    let fired = list.as_array().and_then(|l| l.iter().find(|s| s["name"] == "tick")).expect("tick listed");
    assert!(fired["state"]["last_task"].is_string() && fired["state"]["last_fire_ms"].is_u64(), "{list}");
    assert_eq!(fired["fields"]["payload"], json!({ "n": 1, "tag": "x" }), "{list}");
    schedules.rejects("a shard count as text", &with(&list, "/0/fields/total", json!("2")));
    schedules.rejects("a flag as text", &with(&list, "/0/fields/keep_results", json!("1")));
    schedules.rejects("fields as a list of pairs", &with(&list, "/0/fields", json!([["kind", "noop"]])));
    schedules.rejects("a time as text", &with(&list, "/0/state/next_fire_ms", json!("1")));
    schedules.rejects("an unknown overlap policy", &with(&list, "/0/overlap", json!("queue")));
    cli.ok(&["schedule", "remove", "tick"]);
    cli.ok(&["schedule", "remove", "late"]);
    assert!(coordinator.terminate().success(), "{}", coordinator.log());

    // a stalled shard: an executor holding two shards is SIGKILLed, another takes them back
    let mut victim = cli.executor("schema-victim", &[]);
    let sleepy =
        ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":600000}"#, "--shards", "2", "--task-id", "stuck"];
    cli.ok(&cat(&sleepy, &["--priority", "100"]));
    eventually("the victim to hold both sleep shards", PATIENCE, || {
        let held: HashMap<String, String> = redis::cmd("HGETALL").arg(cli.key("active")).query(&mut cli.con()).unwrap();
        let n = held.keys().filter(|r| r.starts_with("stuck:")).count();
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{held:?}"))
        }
    });
    victim.kill();
    let _executor = cli.executor("schema-exec", &[]);
    await_event(&cli, "shard_stalled");
    cli.ok(&["cancel", "stuck"]);

    // a delayed task starts; shards fail, are retried, fail for good; the task is retried
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "1", "--task-id", "delayed", "--delay", "300ms"]);
    cli.ok(&["wait", "delayed"]);
    let flaky = ["dispatch", "--kind", "fail", "--payload", r#"{"rate":1.0}"#, "--shards", "2", "--task-id", "flaky"];
    let out = cli.run(&cat(&flaky, &["--attempts", "2", "--backoff", "fixed:10ms", "--wait"]));
    assert_eq!(out.code(), 3, "{out:?}");
    cli.ok(&["retry", "flaky"]);
    assert_eq!(cli.run(&["wait", "flaky"]).code(), 3);
    // a failure that defers its shard, then one that fails its task at once
    let payload = r#"{"rate":1.0,"class":"retry_after","after_ms":10}"#;
    let deferred = ["dispatch", "--kind", "fail", "--payload", payload, "--shards", "1", "--task-id", "deferred"];
    cli.ok(&deferred);
    await_event(&cli, "shard_deferred");
    cli.ok(&["cancel", "deferred"]);
    let fatal = r#"{"rate":1.0,"class":"fail_task"}"#;
    let out =
        cli.run(&["dispatch", "--kind", "fail", "--payload", fatal, "--shards", "3", "--task-id", "fatal", "--wait"]);
    assert_eq!(out.code(), 3, "{out:?}");
    // k-of-n: a task that settles once 2 of its 40 shards completed
    let k = ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":100}"#, "--shards", "40", "--success-when", "2"];
    cli.ok(&[&k[..], &["--task-id", "k", "--wait"][..]].concat());
    // the schedules' tasks have run meanwhile (completed, each shard logged as completed)
    await_event(&cli, "task_completed");
    await_event(&cli, "shard_completed");

    // every event in the log, as `watch --json` prints it
    let logged = logged_events(&cli);
    let count = logged.len().to_string();
    let out = cli.ok(&["watch", "--from-start", "--count", &count, "--json"]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a watch line is not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), logged.len(), "{out}");

    // every kind of event the schema knows was seen
    let schema = read_json(&schema_dir().join("watch-event.schema.json"));
    let known: BTreeSet<&str> = schema["properties"]["event"]["enum"]
        .as_array()
        .expect("the event enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut seen: BTreeSet<&str> = lines.iter().filter_map(|e| e["event"].as_str()).collect();
    // a queue spread over partitions logs them (seen below)
    seen.insert("share_counted");
    seen.insert("share_uncounted");
    seen.insert("share_stopped");
    // backups for stragglers need a slow node (seen in watch_of_backups_matches_the_schema)
    seen.insert("shard_speculated");
    seen.insert("speculation_won");
    let unseen: Vec<&&str> = known.difference(&seen).collect();
    assert!(unseen.is_empty(), "no event of kinds {unseen:?} was logged: {logged:?}");

    // each schema rejects a wrong value
    let dispatched = lines.iter().find(|e| e["event"] == "task_dispatched").expect("a task_dispatched event");
    event.check("watch --json (task_dispatched)", dispatched);
    event.rejects("a shard count as text", &with(dispatched, "/total", json!("2")));
    event.rejects("a time as text", &with(dispatched, "/time_ms", json!("1")));
    event.rejects("a field of another event", &changed(dispatched, |e| e["shard"] = json!(0)));
    event.rejects("a missing field", &without(dispatched, "", "seq"));
    event.rejects("an unknown event", &with(dispatched, "/event", json!("task_exploded")));
    let retried = lines.iter().find(|e| e["event"] == "shard_retried").expect("a shard_retried event");
    event.rejects("a shard index that is neither a number nor agg", &with(retried, "/shard", json!("x")));

    // last: each event against the schema, all defects at once, by kind of event
    let mut defects: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for e in &lines {
        let errors = event.errors(e);
        if !errors.is_empty() {
            let kind = e["event"].as_str().unwrap_or("?").to_owned();
            defects.entry(kind).or_insert_with(|| (0, format!("{}\n      e.g. {e}", errors.join("; ")))).0 += 1;
        }
    }
    let report: Vec<String> = defects.iter().map(|(k, (n, why))| format!("{k} ({n} events): {why}")).collect();
    assert!(
        defects.is_empty(),
        "watch --json: events that do not match docs/schemas/watch-event.schema.json \
         (a field missing from the numbers of `json_field` in src/cli/mod.rs prints as text):\n  {}",
        report.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------
// bench

#[test]
fn bench_report_matches_its_schema() {
    let bench = Schema::load("bench");
    // the two cheapest scenarios, on a private redis-server the bench starts itself
    let args =
        ["bench", "--shards", "2", "--runs", "2", "--only", "dispatch-pull,dispatch-routed", "--no-bullmq", "--json"];
    let out = shardctl(&args);
    assert_eq!(out.code(), 0, "{out:?}");
    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
    bench.check("bench --json", &report);
    let scenarios = report["scenarios"].as_object().expect("scenarios");
    assert!(scenarios.contains_key("dispatch-pull") && scenarios.contains_key("dispatch-routed"), "{report}");
    assert_eq!(report["scenarios"]["dispatch-pull"]["runs"].as_array().map(Vec::len), Some(2), "{report}");
    assert!(report["table"].as_array().is_some_and(|t| !t.is_empty()), "{report}");

    bench.rejects("a figure as text", &with(&report, "/table/0/number", json!("0.5")));
    bench.rejects("a run's figure as text", &with(&report, "/scenarios/dispatch-pull/runs/0/ms", json!("0.5")));
    bench.rejects("a count as text", &with(&report, "/runs", json!("2")));
    bench.rejects("a verdict flag as text", &with(&report, "/table/0/met", json!("yes")));
    bench.rejects(
        "an unknown scenario",
        &changed(&report, |r| r["scenarios"]["warp"] = report["scenarios"]["dispatch-pull"].clone()),
    );
}

/// A queue spread over partitions: `watch --json` merges the partitions' shard events (at the
/// task's indexes) with the home's, and every line matches the schema, `share_counted` and a
/// retry's round among them.
#[test]
fn watch_over_partitions_matches_the_schema() {
    let event = Schema::load("watch-event");
    let cli = Cli::start("schema-parts");
    cli.ok(&["config", "--partitions", "2"]);
    let _e = cli.executor("schema-pe", &[]);
    let args = [
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":1}"#,
        "--shards",
        "4",
        "--attempts",
        "1",
        "--task-id",
        "pf",
    ];
    cli.ok(&args);
    assert_eq!(cli.run(&["wait", "pf"]).code(), 3);
    cli.ok(&["retry", "pf"]);
    assert_eq!(cli.run(&["wait", "pf"]).code(), 3);
    // dispatched, 4 failed, 2 counted, aggregating, failed; retried (round 1), 4 failed, 2
    // counted, aggregating, failed
    let out = cli.ok(&["watch", "--from-start", "--count", "18", "--json"]);
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for l in &lines {
        event.check("watch --json over partitions", l);
    }
    let shards: BTreeSet<u64> =
        lines.iter().filter(|e| e["event"] == "shard_failed").filter_map(|e| e["shard"].as_u64()).collect();
    assert_eq!(shards, (0..4).collect(), "{out}");
    // each per-shard event names its partition's log: (partition, id) pairs are unique
    let shard_events: Vec<&Value> =
        lines.iter().filter(|e| e["event"].as_str().is_some_and(|k| k.starts_with("shard_"))).collect();
    assert!(shard_events.iter().all(|e| e["partition"].as_u64().is_some_and(|p| (1..=2).contains(&p))), "{out}");
    let pairs: BTreeSet<(u64, &str)> =
        shard_events.iter().map(|e| (e["partition"].as_u64().unwrap(), e["id"].as_str().unwrap())).collect();
    assert_eq!(pairs.len(), shard_events.len(), "{out}");
    let counted = lines.iter().filter(|e| e["event"] == "share_counted").count();
    assert_eq!(counted, 4, "{out}");
    let retried = lines.iter().find(|e| e["event"] == "task_retried").expect("a task_retried event");
    assert_eq!((retried["shards"].as_u64(), retried["round"].as_u64()), (Some(4), Some(1)), "{retried}");

    // a share that lost writes after its count (a failover of its partition's master): its count
    // forgotten, then counted anew (the home claims nothing meanwhile, so the loss comes first)
    let mut con = cli.con();
    let () = redis::cmd("HSET").arg(cli.key("meta")).arg("paused").arg(1).query(&mut con).unwrap();
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "4", "--task-id", "pl"]);
    support::eventually("both shares counted", std::time::Duration::from_secs(30), || {
        let s: Option<String> = redis::cmd("HGET").arg(cli.key("task:pl")).arg("state").query(&mut con).unwrap();
        s.filter(|s| s == "aggregating").map(|_| ()).ok_or("not aggregating yet")
    });
    let part: String = cli.json(&["config", "--json"], 0)["partition_tags"][0].as_str().unwrap().to_owned();
    support::lose_a_counted_completion(&mut con, &format!("{{{part}}}:"), "pl", 1);
    cli.ok(&["resume"]);
    assert_eq!(cli.run(&["wait", "pl"]).code(), 0);
    // as many lines as the logs hold for it: the home's, and the partitions' per-shard ones
    let mut logged = 0;
    let tags = cli.json(&["config", "--json"], 0)["partition_tags"].clone();
    let logs = std::iter::once(cli.key("events"))
        .chain(tags.as_array().unwrap().iter().map(|t| format!("{{{}}}:events", t.as_str().unwrap())));
    for (i, log) in logs.enumerate() {
        let entries: Vec<(String, std::collections::HashMap<String, String>)> =
            redis::cmd("XRANGE").arg(log).arg("-").arg("+").query(&mut con).unwrap();
        logged +=
            entries.iter().filter(|(_, f)| f["task"] == "pl" && (i == 0 || f["event"].starts_with("shard_"))).count();
    }
    let out = cli.ok(&["watch", "--task", "pl", "--from-start", "--count", &logged.to_string(), "--json"]);
    let uncounted: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "share_uncounted")
        .collect();
    assert_eq!(uncounted.len(), 1, "{out}");
    event.check("watch --json (share_uncounted)", &uncounted[0]);
    event.rejects("a partition as text", &with(&uncounted[0], "/partition", json!("1")));

    // a task that meets its success goal: its home settles, then each share stops
    // (`share_stopped`, shown with its partition)
    let k = ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":200}"#, "--shards", "40", "--success-when", "2"];
    cli.ok(&[&k[..], &["--task-id", "pk", "--wait"][..]].concat());
    let mut logged = 0;
    for (i, log) in std::iter::once(cli.key("events"))
        .chain(tags.as_array().unwrap().iter().map(|t| format!("{{{}}}:events", t.as_str().unwrap())))
        .enumerate()
    {
        let entries: Vec<(String, std::collections::HashMap<String, String>)> =
            redis::cmd("XRANGE").arg(log).arg("-").arg("+").query(&mut con).unwrap();
        let shown = |e: &str| i == 0 || e.starts_with("shard_") || e == "share_stopped";
        logged += entries.iter().filter(|(_, f)| f["task"] == "pk" && shown(&f["event"])).count();
    }
    let out = cli.ok(&["watch", "--task", "pk", "--from-start", "--count", &logged.to_string(), "--json"]);
    let stopped: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "share_stopped")
        .collect();
    assert_eq!(stopped.len(), 2, "{out}");
    for e in &stopped {
        event.check("watch --json (share_stopped)", e);
    }
    event.rejects("a stopped count as text", &with(&stopped[0], "/stopped", json!("1")));
}

/// Backups for stragglers (docs/design/speculation.md): `shard_speculated` and
/// `speculation_won` as `watch --json` prints them match the schema, and `status --json` the
/// task schema with its speculation fields.
#[test]
fn watch_of_backups_matches_the_schema() {
    let event = Schema::load("watch-event");
    let task = Schema::load("task");
    let cli = Cli::start("schema-spec");
    let _fast = cli.executor("schema-fast", &["--concurrency", "4"]);
    let _slow = cli.executor("schema-slow", &["--concurrency", "4"]);
    let payload = r#"{"ms":20,"slow_node":"schema-slow","slow_factor":500}"#;
    let args =
        ["dispatch", "--kind", "sleep", "--payload", payload, "--shards", "60", "--speculate", "--task-id", "sp"];
    cli.ok(&[&args[..], &["--wait", "--timeout", "60s"][..]].concat());
    let t = cli.json(&["status", "sp", "--json"], 0);
    task.check("status --json (speculation)", &t);
    let logged: Vec<(String, std::collections::HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(cli.key("events")).arg("-").arg("+").query(&mut cli.con()).unwrap();
    let count = logged.len().to_string();
    let out = cli.ok(&["watch", "--from-start", "--count", &count, "--json"]);
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for kind in ["shard_speculated", "speculation_won"] {
        let e = lines.iter().find(|e| e["event"] == kind).unwrap_or_else(|| panic!("no {kind} event: {out}"));
        event.check(&format!("watch --json ({kind})"), e);
    }
    let started = lines.iter().find(|e| e["event"] == "shard_speculated").unwrap();
    event.rejects("a running time as text", &with(started, "/running_ms", json!("1")));
    let won = lines.iter().find(|e| e["event"] == "speculation_won").unwrap();
    event.rejects("an attempt that is neither", &with(won, "/attempt", json!("third")));
}
