//! The monitoring kit of `deploy/` (issue 15): the Prometheus rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`), every alert has a case that fires and one that
//! must not; the Grafana dashboard is importable (schema, datasource variable, queue variable, the
//! panels it promises) and its queries are valid PromQL (`promtool check rules` on them as
//! recording rules); every metric the dashboard and the rules read is one the binary exports
//! (the crates' public constants); and a real executor and coordinator, scraped after a run,
//! export exactly those metrics, with the labels the queries, legends and annotations use.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use shardctl_coordinator::metrics as cm;
use shardctl_executor::metrics as em;
use shardctl_testkit::{Process, TestRedis};

const DASHBOARD: &str = "grafana/shardctl-dashboard.json";
const RULES: &str = "prometheus/shardctl-rules.yml";
const RULE_TESTS: &str = "prometheus/shardctl-rules.test.yml";

/// The panels the dashboard promises, by title.
const PANELS: [&str; 13] = [
    "Executors live",
    "Running and failed tasks",
    "Queue: waiting, active, delayed, paused",
    "Throughput: completed, claimed, failed",
    "Failures by class",
    "Shards in flight",
    "Shard run time (p50, p90, p99)",
    "Claim round trip (p50, p90, p99)",
    "Task progress",
    "Tasks: done, failed, total",
    "Lock heartbeats and locks lost",
    "Stalled shards: recovered and failed",
    "Redis reconnects",
];

/// Labels Prometheus adds to every scraped series.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// How long the live run may take before the test calls it hung (a guard, not a timing).
const GUARD: Duration = Duration::from_secs(60);

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(rel)
}

fn read(rel: &str) -> String {
    let path = deploy(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every series name the binary exports, from the crates' constants: the histograms as their
/// `_bucket`, `_sum` and `_count` series (a bare histogram name is no series).
fn exported() -> BTreeSet<String> {
    let plain = [
        em::SHARDS_CLAIMED,
        em::SHARDS_COMPLETED,
        em::SHARDS_FAILED,
        em::ATTEMPTS_FAILED,
        em::SHARDS_RETRIED,
        em::SHARDS_RELEASED,
        em::AGGREGATIONS,
        em::LOCK_HEARTBEATS,
        em::LOCKS_EXTENDED,
        em::LOCKS_LOST,
        em::SHARDS_CANCELLED,
        em::BACKUPS_STARTED,
        em::BACKUPS_WON,
        em::DURABILITY_CONFIRMATIONS,
        em::DURABILITY_TIMEOUTS,
        em::DURABILITY_LOST,
        em::SHARDS_IN_FLIGHT,
        em::REDIS_RECONNECTS,
        cm::STALLED_RECOVERED,
        cm::STALLED_FAILED,
        cm::TASK_SHARDS,
        cm::TASK_SHARDS_DONE,
        cm::TASK_SHARDS_FAILED,
        cm::TASK_PROGRESS_RATIO,
        cm::QUEUE_WAITING,
        cm::QUEUE_ACTIVE,
        cm::QUEUE_DELAYED,
        cm::QUEUE_PAUSED,
        cm::QUEUE_RUNNING_TASKS,
        cm::QUEUE_FAILED_TASKS,
        cm::EXECUTORS_LIVE,
    ];
    let mut names: BTreeSet<String> = plain.iter().map(|s| s.to_string()).collect();
    let histograms = em::buckets().map(|(name, _)| name);
    assert_eq!(histograms, [em::SHARD_RUN_SECONDS, em::CLAIM_SECONDS, em::BACKUP_LOST_SECONDS]);
    for h in histograms {
        for suffix in ["_bucket", "_sum", "_count"] {
            names.insert(format!("{h}{suffix}"));
        }
    }
    names
}

/// What an expression reads: its `shardctl_` metric names, and the label names it uses (in
/// selectors' matchers and in `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`).
/// A scanner, not a parser: quoted strings are skipped, identifiers taken whole.
fn scan(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let c: Vec<char> = expr.chars().collect();
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let skip_ws = |mut i: usize| {
        while i < c.len() && c[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let skip_quoted = |mut i: usize| {
        let q = c[i];
        i += 1;
        while i < c.len() && c[i] != q {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    let (mut metrics, mut labels) = (BTreeSet::new(), BTreeSet::new());
    let mut i = 0;
    while i < c.len() {
        if matches!(c[i], '"' | '\'' | '`') {
            i = skip_quoted(i);
            continue;
        }
        if !(c[i].is_ascii_alphabetic() || c[i] == '_') || (i > 0 && ident(c[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < c.len() && ident(c[i]) {
            i += 1;
        }
        let word: String = c[start..i].iter().collect();
        let grouping = matches!(word.as_str(), "by" | "without" | "on" | "ignoring" | "group_left" | "group_right");
        if word.starts_with("shardctl_") {
            metrics.insert(word.clone());
        }
        let j = skip_ws(i);
        if j < c.len() && (c[j] == '{' || (c[j] == '(' && grouping)) {
            // a selector's matchers or a grouping's label list: the names before `=!~` or `,`
            let close = if c[j] == '{' { '}' } else { ')' };
            i = j + 1;
            while i < c.len() && c[i] != close {
                if matches!(c[i], '"' | '\'' | '`') {
                    i = skip_quoted(i);
                } else if c[i].is_ascii_alphabetic() || c[i] == '_' {
                    let s = i;
                    while i < c.len() && ident(c[i]) {
                        i += 1;
                    }
                    labels.insert(c[s..i].iter().collect::<String>());
                } else {
                    i += 1;
                }
            }
        }
    }
    (metrics, labels)
}

/// The `{{label}}` names of a Grafana legend, or the `$labels.label` names of an annotation.
fn template_labels(text: &str, open: &str, close: &[char]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(p) = rest.find(open) {
        rest = &rest[p + open.len()..];
        let name = rest.trim_start();
        let end = name.find(|ch: char| close.contains(&ch) || ch.is_whitespace()).unwrap_or(name.len());
        if end > 0 {
            out.insert(name[..end].to_owned());
        }
    }
    out
}

// ---------------------------------------------------------------- the dashboard, walked

/// Every panel of the dashboard, rows' nested panels included.
fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// A dashboard query as Prometheus gets it: Grafana's variables replaced.
fn as_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m").replace("$queue", ".*").replace("$node", ".*")
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every `expr` of the dashboard, with the title of its panel.
fn dashboard_exprs(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("?").to_owned(), e.to_owned()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------- the rules, read as text

/// One alerting rule: its name, its block of lines (comments dropped), its expression.
struct Alert {
    name: String,
    block: String,
    expr: String,
}

/// The alerts of the rules file, read line by line (there is no YAML crate here): a block runs
/// from `- alert:` to the next; `expr:` is inline or a `|` block of deeper lines.
fn alerts(text: &str) -> Vec<Alert> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    let mut out: Vec<Alert> = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = line.trim_start().strip_prefix("- alert:") else { continue };
        let end = lines[n + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with("- alert:"))
            .map_or(lines.len(), |p| n + 1 + p);
        let block = &lines[n..end];
        let (k, expr_line) = block
            .iter()
            .enumerate()
            .find(|(_, l)| l.trim_start().starts_with("expr:"))
            .unwrap_or_else(|| panic!("alert {name} has no expr"));
        let indent = expr_line.len() - expr_line.trim_start().len();
        let inline = expr_line.trim_start()["expr:".len()..].trim();
        let expr = if inline.starts_with('|') || inline.starts_with('>') {
            block[k + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            inline.trim_matches(|c| c == '"' || c == '\'').to_owned()
        };
        out.push(Alert { name: name.trim().to_owned(), block: block.join("\n"), expr });
    }
    out
}

/// Per alertname of the unit tests: (cases expecting it to fire, cases expecting nothing).
fn rule_cases(text: &str) -> BTreeMap<String, (usize, usize)> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("alertname:") else { continue };
        let next = lines.get(n + 1).copied().unwrap_or_default();
        let entry = out.entry(name.trim().to_owned()).or_default();
        match next.strip_prefix("exp_alerts:").map(str::trim) {
            Some("[]") => entry.1 += 1,
            Some("") => entry.0 += 1,
            _ => panic!("{RULE_TESTS}: alertname {name} is not followed by exp_alerts: {next:?}"),
        }
    }
    out
}

// ---------------------------------------------------------------- promtool

/// Runs promtool with `args`; asserts it succeeds, with its output on failure.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().unwrap_or_else(|e| panic!("promtool did not start: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed ({:?}):\n{text}", out.status);
    text
}

fn have_promtool() -> bool {
    shardctl_testkit::tool_available("promtool", &["--version"], "`promtool check rules` and `promtool test rules`")
}

#[test]
fn rules_pass_promtool_check_and_their_unit_tests() {
    if !have_promtool() {
        return;
    }
    let rules = deploy(RULES);
    let out = promtool(&["check", "rules", rules.to_str().unwrap()]);
    let n = alerts(&read(RULES)).len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
    let tests = deploy(RULE_TESTS);
    let out = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_is_complete_and_tested_both_ways() {
    let rules = alerts(&read(RULES));
    assert!(rules.len() >= 6, "{} alerts", rules.len());
    let cases = rule_cases(&read(RULE_TESTS));
    for a in &rules {
        for needle in ["for:", "severity:", "summary:", "description:", "$labels.queue"] {
            assert!(a.block.contains(needle), "alert {} lacks {needle:?}:\n{}", a.name, a.block);
        }
        let severity = a.block.lines().find_map(|l| l.trim().strip_prefix("severity:")).unwrap().trim();
        assert!(["critical", "warning", "info"].contains(&severity), "alert {}: severity {severity:?}", a.name);
        let (fire, quiet) = cases.get(&a.name).copied().unwrap_or_default();
        assert!(fire >= 1, "alert {} has no unit test case that fires in {RULE_TESTS}", a.name);
        assert!(quiet >= 1, "alert {} has no unit test case that must not fire in {RULE_TESTS}", a.name);
    }
    let names: BTreeSet<&str> = rules.iter().map(|a| a.name.as_str()).collect();
    for tested in cases.keys() {
        assert!(names.contains(tested.as_str()), "{RULE_TESTS} tests {tested}, which {RULES} does not define");
    }
}

#[test]
fn dashboard_is_importable_and_has_its_panels() {
    let dash = dashboard();
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 38), "schemaVersion {}", dash["schemaVersion"]);
    assert!(dash["uid"].as_str().is_some_and(|u| !u.is_empty() && u.len() <= 40), "uid {}", dash["uid"]);

    // the datasource variable every panel uses, and the queue variable
    let vars = dash["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no variable {name}"));
    let ds = var("DS_PROMETHEUS");
    assert_eq!((ds["type"].as_str(), ds["query"].as_str()), (Some("datasource"), Some("prometheus")));
    let inputs = dash["__inputs"].as_array().expect("__inputs, for the import dialog");
    assert!(inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"));
    let queue = var("queue");
    assert_eq!(queue["type"], "query");
    for q in [&queue["definition"], &queue["query"]["query"]] {
        assert_eq!(q.as_str(), Some("label_values(shardctl_queue_waiting, queue)"));
    }
    let uses_ds = |v: &Value| v["type"] == "prometheus" && v["uid"] == "${DS_PROMETHEUS}";
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert!(uses_ds(&v["datasource"]), "variable {}: datasource {}", v["name"], v["datasource"]);
    }

    let all = panels(&dash);
    let mut ids = BTreeSet::new();
    for p in &all {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "panel id {} twice", p["id"]);
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "panel {}: gridPos {g}", p["title"]);
        if p["type"] == "row" {
            continue;
        }
        assert!(uses_ds(&p["datasource"]), "panel {}: datasource {}", p["title"], p["datasource"]);
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        assert!(!targets.is_empty(), "panel {} has no targets", p["title"]);
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(uses_ds(&t["datasource"]), "panel {}: target datasource {}", p["title"], t["datasource"]);
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "panel {}: empty expr", p["title"]);
            assert!(refs.insert(t["refId"].as_str().expect("refId")), "panel {}: refId twice", p["title"]);
        }
    }
    // no two panels overlap (Grafana would move them)
    let rects: Vec<(u64, u64, u64, u64, &str)> = all
        .iter()
        .map(|p| {
            let g = &p["gridPos"];
            let n = |k: &str| g[k].as_u64().unwrap();
            (n("x"), n("y"), n("w"), n("h"), p["title"].as_str().unwrap_or("?"))
        })
        .collect();
    for (i, a) in rects.iter().enumerate() {
        for b in &rects[i + 1..] {
            let apart = a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
            assert!(apart, "panels {:?} and {:?} overlap", a.4, b.4);
        }
    }

    let titles: BTreeSet<&str> = all.iter().filter_map(|p| p["title"].as_str()).collect();
    for want in PANELS {
        assert!(titles.contains(want), "no panel titled {want:?}; panels: {titles:?}");
    }
    // the quantile panels: p50, p90, p99 of a histogram's buckets, by le
    for title in ["Shard run time (p50, p90, p99)", "Claim round trip (p50, p90, p99)"] {
        let exprs: Vec<String> =
            dashboard_exprs(&dash).into_iter().filter(|(t, _)| t == title).map(|(_, e)| e).collect();
        for q in ["0.5", "0.9", "0.99"] {
            let e = exprs.iter().find(|e| e.starts_with(&format!("histogram_quantile({q},")));
            let e = e.unwrap_or_else(|| panic!("{title}: no quantile {q} in {exprs:?}"));
            assert!(e.contains("_bucket") && e.contains("by (le)") && e.contains("rate("), "{title}: {e}");
        }
    }
}

#[test]
fn dashboard_and_rules_read_only_exported_metrics_and_the_dashboard_reads_them_all() {
    let exported = exported();
    let dash = dashboard();
    let mut read_by_dashboard = BTreeSet::new();
    let mut exprs: Vec<(String, String)> = dashboard_exprs(&dash);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(d) = v["definition"].as_str() {
            exprs.push((format!("variable {}", v["name"]), d.to_owned()));
        }
    }
    for (title, e) in &exprs {
        let (metrics, _) = scan(e);
        assert!(!metrics.is_empty(), "{title}: {e} reads no shardctl metric");
        for m in metrics {
            assert!(exported.contains(&m), "dashboard, {title}: {m} is not exported by shardctl ({e})");
            read_by_dashboard.insert(m);
        }
    }
    for m in &exported {
        assert!(read_by_dashboard.contains(m), "the dashboard shows nothing of {m}");
    }
    for a in alerts(&read(RULES)) {
        let (metrics, _) = scan(&a.expr);
        assert!(!metrics.is_empty(), "alert {}: {} reads no shardctl metric", a.name, a.expr);
        for m in metrics {
            assert!(exported.contains(&m), "alert {}: {m} is not exported by shardctl ({})", a.name, a.expr);
        }
    }
    // and the rule tests feed only exported series
    for line in read(RULE_TESTS).lines().filter(|l| l.trim_start().starts_with("- series:")) {
        for m in scan(line.split_once(':').unwrap().1.trim().trim_matches('\'')).0 {
            assert!(exported.contains(&m), "{RULE_TESTS}: series {m} is not exported by shardctl");
        }
    }
}

#[test]
fn dashboard_queries_are_valid_promql() {
    if !have_promtool() {
        return;
    }
    // each query as a recording rule: `promtool check rules` parses it
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (_, e)) in dashboard_exprs(&dashboard()).iter().enumerate() {
        let quoted = serde_json::to_string(&as_promql(e)).unwrap();
        yaml.push_str(&format!("      - record: dashboard:query_{n}\n        expr: {quoted}\n"));
    }
    let path = std::env::temp_dir().join(format!("shardctl-monitoring-{}-dashboard.yml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let out = Command::new("promtool").args(["check", "rules"]).arg(&path).output().expect("promtool");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "promtool refused a dashboard query:\n{}{}\n--- as rules\n{yaml}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------- a real exporter

fn free_addr() -> String {
    shardctl_testkit::free_addr()
}

/// `GET /metrics`; the body, or `None` while nothing answers.
fn get_metrics(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.lines().next()?.contains(" 200").then(|| body.to_owned())
}

/// The series names of a scrape, each with the label names it carries.
fn series_labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (metrics, labels) = scan(&line[..line.rfind(' ').unwrap_or(line.len())]);
        assert!(metrics.len() <= 1, "bad sample line {line:?}");
        out.entry(line[..name_end].to_owned()).or_default().extend(labels);
    }
    out
}

/// `shardctl --redis URL --queue Q <args>`, with nothing leaking in from the environment.
fn shardctl(url: &str, queue: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardctl"));
    c.args(["--redis", url, "--queue", queue]).args(args);
    for var in ["SHARDCTL_REDIS", "SHARDCTL_QUEUE", "SHARDCTL_LOG", "RUST_LOG"] {
        c.env_remove(var);
    }
    c
}

#[test]
fn a_running_executor_and_coordinator_export_what_the_dashboard_and_rules_read() {
    let redis = TestRedis::start();
    let (url, queue) = (redis.url(), "monitoring");
    let (eaddr, caddr) = (free_addr(), free_addr());
    let executor = Process::spawn(
        shardctl(
            &url,
            queue,
            &[
                "executor",
                "--node-id",
                "mon1",
                "--concurrency",
                "2",
                "--block-timeout",
                "200ms",
                "--metrics-addr",
                &eaddr,
            ],
        ),
        "monitoring-executor",
    );
    let coordinator = Process::spawn(
        shardctl(&url, queue, &["coordinator", "--metrics-addr", &caddr, "--refresh", "200ms"]),
        "monitoring-coordinator",
    );
    // a task run to its end: the histograms get observations, the coordinator its task gauges
    let out = shardctl(&url, queue, &["dispatch", "--shards", "4", "--items", "1000", "--task-id", "mon", "--wait"])
        .args(["--timeout", "60s"])
        .output()
        .expect("run shardctl dispatch");
    assert!(
        out.status.success(),
        "dispatch --wait: {:?}\n{}\nexecutor:\n{}\ncoordinator:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        executor.log(),
        coordinator.log()
    );

    // scrape both until every exported series shows
    let exported = exported();
    let deadline = Instant::now() + GUARD;
    let scraped = loop {
        let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for addr in [&eaddr, &caddr] {
            for (name, labels) in get_metrics(addr).map(|t| series_labels(&t)).unwrap_or_default() {
                all.entry(name).or_default().extend(labels);
            }
        }
        let missing: Vec<&String> = exported.iter().filter(|m| !all.contains_key(*m)).collect();
        if missing.is_empty() {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "never scraped {missing:?}; scraped {:?}\nexecutor:\n{}\ncoordinator:\n{}",
            all.keys().collect::<Vec<_>>(),
            executor.log(),
            coordinator.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // nothing exported that the monitoring kit does not know of
    for name in scraped.keys().filter(|n| n.starts_with("shardctl_")) {
        assert!(
            exported.contains(name),
            "{name} is exported but unknown to tests/monitoring.rs: add its constant to exported() and show it on the dashboard"
        );
    }

    // the labels each query, legend and annotation uses are carried by the metrics it reads
    let labels_of = |metrics: &BTreeSet<String>| -> BTreeSet<String> {
        let mut l: BTreeSet<String> = TARGET_LABELS.iter().map(|s| s.to_string()).collect();
        for m in metrics {
            l.extend(scraped[m].iter().cloned());
        }
        l
    };
    let dash = dashboard();
    for p in panels(&dash).into_iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().unwrap_or("?");
        let mut read_here = BTreeSet::new();
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap_or_default();
            let (metrics, used) = scan(&as_promql(e));
            let have = labels_of(&metrics);
            for l in used {
                assert!(have.contains(&l), "panel {title}: label {l} is on none of {metrics:?} ({e})");
            }
            read_here.extend(metrics);
        }
        let have = labels_of(&read_here);
        for t in p["targets"].as_array().into_iter().flatten() {
            for l in template_labels(t["legendFormat"].as_str().unwrap_or_default(), "{{", &['}']) {
                assert!(have.contains(&l), "panel {title}: legend label {l} is on none of {read_here:?}");
            }
        }
    }
    for a in alerts(&read(RULES)) {
        let (metrics, used) = scan(&a.expr);
        let have = labels_of(&metrics);
        for l in used.into_iter().chain(template_labels(&a.block, "$labels.", &['}', ' '])) {
            assert!(have.contains(&l), "alert {}: label {l} is on none of {metrics:?}", a.name);
        }
    }
}

#[test]
fn the_scanner_finds_metrics_and_labels() {
    let (m, l) = scan(
        r#"sum by (queue, node) (rate(shardctl_a_total{class!="x,y", node=~"$node"}[5m])) / on (queue) group_left shardctl_b > 0 and ignoring(le) "shardctl_quoted""#,
    );
    assert_eq!(m, BTreeSet::from(["shardctl_a_total".to_owned(), "shardctl_b".to_owned()]));
    let want: BTreeSet<String> = ["queue", "node", "class", "le"].iter().map(|s| s.to_string()).collect();
    assert_eq!(l, want);
    assert_eq!(
        template_labels("{{task}} ({{ kind }})", "{{", &['}']),
        BTreeSet::from(["task".to_owned(), "kind".to_owned()])
    );
    assert_eq!(
        template_labels("on {{ $labels.queue }} at", "$labels.", &['}', ' ']),
        BTreeSet::from(["queue".to_owned()])
    );
}
