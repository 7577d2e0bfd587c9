//! The coordinator's dashboard in a real browser (headless Chromium over WebDriver) and its API
//! over plain HTTP, against real executor and coordinator processes and a private redis-server:
//! live progress without a reload, the shard map's failed cells, retry with the token, the API
//! refusing without it, hostile text shown as text.

#[allow(dead_code)]
mod support;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;
use shardctl_testkit::browser::{Browser, Locator};
use shardctl_testkit::free_port;
use support::{eventually, Cli, Process};

const PATIENCE: Duration = Duration::from_secs(60);
/// A token of the test (an action needs it when the coordinator was given it).
const TOKEN: &str = "test-token-0123456789abcdef";

/// A coordinator of the test's queue serving the dashboard on a free port; `token`: with an
/// action token file.
fn coordinator(cli: &Cli, token: bool) -> (Process, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["coordinator", "--metrics-addr", "off", "--ui-addr", &addr, "--refresh", "200ms"];
    let file = std::env::temp_dir().join(format!("shardctl-ui-token-{}-{port}", std::process::id()));
    let file_s = file.display().to_string();
    if token {
        std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
        args.extend(["--ui-token-file", &file_s]);
    }
    let c = cli.background("coordinator", &args);
    let base = format!("http://{addr}");
    eventually("the dashboard to answer", PATIENCE, || match http("GET", &format!("{base}/api/info"), None) {
        Ok((200, _, _)) => Ok(()),
        other => Err(format!("{other:?}\n{}", c.log())),
    });
    (c, base)
}

/// One HTTP/1.1 request (no body); returns status, headers (lowercase names) and body.
fn http(method: &str, url: &str, token: Option<&str>) -> std::io::Result<(u16, String, String)> {
    http_as(method, url, token, None)
}

/// [`http`] with another `Host` header than the URL's.
fn http_as(
    method: &str,
    url: &str,
    token: Option<&str>,
    host_header: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let named = host_header.unwrap_or(host);
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {named}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, head.to_lowercase(), body.to_owned()))
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The colour drawn at the centre of each cell of the shard map, as `#rrggbb`.
async fn cell_colours(b: &Browser) -> Vec<String> {
    let v = b
        .eval(
            "const c = document.getElementById('shard-map');
             const size = Number(c.dataset.cellSize), cols = Number(c.dataset.cols), n = Number(c.dataset.cells);
             const ctx = c.getContext('2d');
             const out = [];
             for (let i = 0; i < n; i++) {
               const x = (i % cols) * size + Math.floor(size / 2) - 1, y = Math.floor(i / cols) * size + Math.floor(size / 2) - 1;
               const p = ctx.getImageData(x, y, 1, 1).data;
               out.push('#' + [p[0], p[1], p[2]].map((v) => v.toString(16).padStart(2, '0')).join(''));
             }
             return out;",
        )
        .await;
    serde_json::from_value(v).expect("colours")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_a_run_and_draws_failed_shards_in_their_cells() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-live");
    let (_c, base) = coordinator(&cli, false);

    // a task with failed shards, ended
    cli.ok(&[
        "dispatch",
        "--kind",
        "fail",
        "--payload",
        r#"{"rate":0.3}"#,
        "--shards",
        "60",
        "--attempts",
        "1",
        "--task-id",
        "broken",
    ]);
    let _e = cli.executor("dash-e1", &[]);
    let w = cli.run(&["wait", "broken", "--timeout", "60s"]);
    assert_eq!(w.code(), 3, "{w:?}");
    let failed: Vec<u64> = redis::cmd("HKEYS").arg(cli.key("task:broken:errors")).query(&mut cli.con()).unwrap();
    assert!(!failed.is_empty() && failed.len() < 60, "{failed:?}");

    b.client.goto(&format!("{base}/#/task/broken")).await.unwrap();
    b.until(
        "the shard map",
        PATIENCE,
        "const c = document.getElementById('shard-map'); return c && c.dataset.cells === '60';",
    )
    .await;
    let colours = cell_colours(&b).await;
    for (i, c) in colours.iter().enumerate() {
        let want = if failed.contains(&(i as u64)) { "#e03131" } else { "#2f9e44" };
        assert_eq!(c, want, "cell {i} (failed shards {failed:?}): {colours:?}");
    }
    // the failed shards' reasons, listed
    let listed = b.until("the reasons", PATIENCE, "return document.querySelectorAll('td.reason').length;").await;
    assert_eq!(listed.as_u64(), Some(failed.len() as u64));

    // read-only: no action buttons, and the API refuses
    assert!(b.client.find_all(Locator::Css("#retry, #cancel, #pause")).await.unwrap().is_empty());
    let mode = b.client.find(Locator::Id("mode")).await.unwrap().text().await.unwrap();
    assert!(mode.contains("read-only"), "{mode}");
    let status = b.eval("return fetch('/api/tasks/broken/retry', { method: 'POST' }).then((r) => r.status);").await;
    assert_eq!(status, 403);
    let t = cli.json(&["status", "broken", "--json"], 0);
    assert_eq!(t["state"], "failed", "a refused action changed the task: {t}");

    // a task that failed fast says why, and shows its limit (docs/design/failure-policies.md)
    let fast = r#"{"rate":0.5,"sticky":true,"class":"permanent"}"#;
    let halt = ["dispatch", "--kind", "fail", "--payload", fast, "--shards", "20", "--max-failures", "2"];
    cli.ok(&[&halt[..], &["--task-id", "halted"][..]].concat());
    assert_eq!(cli.run(&["wait", "halted", "--timeout", "60s"]).code(), 3);
    b.client.goto(&format!("{base}/#/task/halted")).await.unwrap();
    let why = b
        .until(
            "the halt's reason",
            PATIENCE,
            "const h = document.getElementById('halted'); return h ? h.textContent : '';",
        )
        .await;
    let why = why.as_str().unwrap_or_default();
    assert!(why.starts_with("failed fast: 3 of 20 shards failed for good (limit 2); first: shard "), "{why}");
    let spec = b.eval("const d = document.querySelector('dl.spec'); return d ? d.textContent : '';").await;
    assert!(spec.as_str().unwrap_or_default().contains("max failures2"), "{spec}");

    // a running task: its progress advances on the page without a reload
    let sharing = ["--weight", "2", "--group", "ops", "--max-running", "3"];
    let slow = ["dispatch", "--kind", "sleep", "--payload", r#"{"ms":250}"#, "--shards", "40", "--task-id", "slow"];
    cli.ok(&[&slow[..], &sharing[..]].concat());
    b.client.goto(&format!("{base}/#/task/slow")).await.unwrap();
    // how it shares the executors (docs/design/fairness.md)
    let shown = b
        .until(
            "the sharing row",
            PATIENCE,
            "const s = document.getElementById('sharing'); return s && s.textContent.includes(' running · weight 2 · group ops · max-running 3') ? s.textContent : '';",
        )
        .await;
    assert!(shown.as_str().is_some_and(|s| !s.is_empty()), "{shown}");
    b.eval("window.notReloaded = true; return 1;").await;
    let first = b.until("the progress bar", PATIENCE, "const p = document.getElementById('progress'); return p && p.getAttribute('max') === '40' ? Number(p.value) + 1 : 0;").await;
    let first = first.as_u64().unwrap() - 1;
    let later = b
        .until(
            "the progress to advance",
            PATIENCE,
            &format!("const p = document.getElementById('progress'); return p && Number(p.value) > {first} && Number(p.value) < 40 ? Number(p.value) : 0;"),
        )
        .await;
    assert!(later.as_u64().unwrap() > first);
    assert_eq!(b.eval("return window.notReloaded === true;").await, true, "the page reloaded");
    // a shot of the page during the run (docs/dashboard.png is one)
    let png = b.client.screenshot().await.unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let to = std::env::var("SHARDCTL_SCREENSHOT")
        .unwrap_or_else(|_| std::env::temp_dir().join("shardctl-dashboard.png").display().to_string());
    std::fs::write(&to, &png).unwrap();
    eprintln!("screenshot: {to}");
    // the queue page lists it, live too
    b.client.goto(&format!("{base}/#/")).await.unwrap();
    b.until(
        "the queue page",
        PATIENCE,
        "return [...document.querySelectorAll('main td a')].some((a) => a.textContent === 'slow');",
    )
    .await;
    let _ = cli.run(&["wait", "slow", "--timeout", "60s"]);
    b.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_page_shows_what_failed_a_moment_ago_and_switches_to_every_queue() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-front");
    let (_c, base) = coordinator(&cli, true);
    // a second queue of the same Redis, with an unfinished task (no executor serves it), and
    // hostile names in the queue set, which are never listed nor made into keys
    let other = Cli::on((), &cli.redis.url(), "nightly");
    other.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "elsewhere"]);
    let hostile = ["<img src=x onerror=alert(1)>", "a}:b", ""];
    for h in hostile {
        // (worked "last" in 2100: first in the list, were they listed)
        let () =
            redis::cmd("ZADD").arg("{shardctl:queues}").arg(4_102_444_800_000u64).arg(h).query(&mut cli.con()).unwrap();
    }

    let _e = cli.executor("front-e1", &[]);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "5", "--task-id", "fine"]);
    assert_eq!(cli.run(&["wait", "fine", "--timeout", "60s"]).code(), 0);
    b.client.goto(&format!("{base}/#/")).await.unwrap();
    b.until(
        "the finished task on the front page",
        PATIENCE,
        "return [...document.querySelectorAll('#recent td a')].some((a) => a.textContent === 'fine');",
    )
    .await;
    // the page is open when a task fails: it comes first, with why, at the next refresh
    let fail = ["dispatch", "--kind", "fail", "--payload", r#"{"rate":1.0}"#, "--shards", "6", "--attempts", "1"];
    cli.ok(&[&fail[..], &["--task-id", "broke"][..]].concat());
    assert_eq!(cli.run(&["wait", "broke", "--timeout", "60s"]).code(), 3);
    let first = b
        .until(
            "the failed task, first",
            PATIENCE,
            "const r = document.querySelector('#recent tbody tr'); \
             return r && r.dataset.state === 'failed' ? [...r.cells].map((c) => c.textContent) : null;",
        )
        .await;
    let cells: Vec<String> = serde_json::from_value(first).unwrap();
    assert_eq!((cells[0].as_str(), cells[2].as_str()), ("broke", "failed"), "{cells:?}");
    assert_eq!(cells[3], "0 of 6 done, 6 failed", "{cells:?}");
    assert!(cells[6].starts_with("6 of 6 shards failed: first, shard "), "{cells:?}");
    let rows = b.eval("return document.querySelectorAll('#recent tbody tr').length;").await;
    assert_eq!(rows, 2, "both finished tasks are listed");
    // its progress bar is red
    b.client.goto(&format!("{base}/#/task/broke")).await.unwrap();
    let red = b
        .until(
            "the progress bar",
            PATIENCE,
            "const p = document.getElementById('progress'); return p ? getComputedStyle(p).accentColor : '';",
        )
        .await;
    assert_eq!(red, "rgb(224, 49, 49)", "a failed task's bar");

    // the API lists every queue (and only valid names), reads another, acts only on its own
    let (status, _, body) = http("GET", &format!("{base}/api/queues"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let listed = json(&body);
    let names: Vec<&str> = listed["queues"].as_array().unwrap().iter().map(|q| q["queue"].as_str().unwrap()).collect();
    assert_eq!(names, ["dash-front", "nightly"], "{listed}");
    assert_eq!(listed["queues"][0]["maintained"], true);
    assert_eq!(listed["queues"][1]["tasks"]["unfinished"], 1, "{listed}");
    let (status, _, body) = http("GET", &format!("{base}/api/tasks?queue=nightly"), None).unwrap();
    assert_eq!((status, json(&body)["tasks"][0]["task_id"].as_str()), (200, Some("elsewhere")), "{body}");
    let long = "q".repeat(65);
    assert_eq!(http("GET", &format!("{base}/api/queue?queue={long}"), None).unwrap().0, 400);
    assert_eq!(http("GET", &format!("{base}/api/queues?queue=nightly"), None).unwrap().0, 400);
    let (status, _, body) = http("POST", &format!("{base}/api/queue/pause?queue=nightly"), Some(TOKEN)).unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only here"), "{body}");
    let paused: Option<String> =
        redis::cmd("HGET").arg("{shardctl:nightly}:meta").arg("paused").query(&mut cli.con()).unwrap();
    assert_eq!(paused, None, "a refused action paused the other queue");

    // the switcher: the other queue's front page, read-only
    b.client.goto(&format!("{base}/#/")).await.unwrap();
    b.until(
        "the queue switcher",
        PATIENCE,
        "const s = document.getElementById('queue-switch'); return s && s.options.length === 2;",
    )
    .await;
    b.eval(
        "const s = document.getElementById('queue-switch'); s.value = 'nightly'; \
         s.dispatchEvent(new Event('change')); return 1;",
    )
    .await;
    b.until(
        "the other queue's unfinished task",
        PATIENCE,
        "return location.search === '?queue=nightly' && \
         [...document.querySelectorAll('main td a')].some((a) => a.textContent === 'elsewhere');",
    )
    .await;
    let mode = b.client.find(Locator::Id("mode")).await.unwrap().text().await.unwrap();
    assert_eq!(mode, "read-only: this coordinator maintains queue dash-front");
    // the switcher lists every queue from there too, the shown one chosen
    let options = b
        .until(
            "the switcher on the other queue",
            PATIENCE,
            "const s = document.getElementById('queue-switch'); \
             return s && s.options.length === 2 ? [s.value, [...s.options].map((o) => o.value)] : null;",
        )
        .await;
    assert_eq!(options, serde_json::json!(["nightly", ["dash-front", "nightly"]]));
    assert!(b.client.find_all(Locator::Css("#pause, #resume, #token-form:not([hidden])")).await.unwrap().is_empty());
    // and a task page of that queue
    b.client.goto(&format!("{base}/?queue=nightly#/task/elsewhere")).await.unwrap();
    b.until(
        "the other queue's task page",
        PATIENCE,
        "const s = document.getElementById('task-id'); return s && s.textContent === 'elsewhere';",
    )
    .await;
    b.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_identical_failures_are_one_group_listing_its_shards_nodes_and_attempts() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-groups");
    let (_c, base) = coordinator(&cli, false);
    // shards 0-59 fail on malformed input (a row number each), 60-63 on a full disk, the others
    // complete; each failure is tried twice, on two executors
    let exec = "sh -c 'i=$SHARDCTL_SHARD_INDEX; \
        if [ $i -lt 60 ]; then echo \"ValueError: malformed date in row $((i * 7 + 3))\" >&2; exit 1; fi; \
        if [ $i -lt 64 ]; then echo \"disk full on volume $i\" >&2; exit 1; fi; echo 1'";
    let _a = cli.executor("grp-a", &["--exec", exec]);
    let _b = cli.executor("grp-b", &["--exec", exec]);
    cli.ok(&[
        "dispatch",
        "--kind",
        "rows",
        "--shards",
        "100",
        "--attempts",
        "2",
        "--backoff",
        "fixed:10ms",
        "--task-id",
        "rows",
    ]);
    assert_eq!(cli.run(&["wait", "rows", "--timeout", "60s"]).code(), 3);

    let (status, _, body) = http("GET", &format!("{base}/api/tasks/rows/failures"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let g = json(&body);
    assert_eq!((g["read"].as_u64(), g["complete"].as_bool()), (Some(64), Some(true)), "{g}");
    let groups = g["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{g}");
    let (rows, disk) = (&groups[0], &groups[1]);
    assert_eq!((rows["count"].as_u64(), rows["failed"].as_u64()), (Some(60), Some(60)), "{rows}");
    let (example, cause) = (&rows["example"], &rows["cause"]);
    assert_eq!(example, "handler exited with status 1: ValueError: malformed date in row 3", "{rows}");
    assert_eq!(cause, "handler exited with status N: ValueError: malformed date in row N", "{rows}");
    let shards: Vec<u64> = rows["shards"].as_array().unwrap().iter().map(|s| s["shard"].as_u64().unwrap()).collect();
    assert_eq!(shards, (0..60).collect::<Vec<_>>());
    // each failed at its second attempt, on one of the two nodes, at a time within the group's
    assert_eq!(rows["attempts"], serde_json::json!([[2, 60]]), "{rows}");
    let nodes = rows["nodes"].as_array().unwrap();
    assert!(nodes.iter().all(|n| n[0] == "grp-a" || n[0] == "grp-b"), "{rows}");
    assert_eq!(nodes.iter().map(|n| n[1].as_u64().unwrap()).sum::<u64>(), 60, "{rows}");
    let (first, last) = (rows["first_ms"].as_u64().unwrap(), rows["last_ms"].as_u64().unwrap());
    for s in rows["shards"].as_array().unwrap() {
        let at = s["at_ms"].as_u64().unwrap();
        assert!(first <= at && at <= last && s["attempt"] == 2 && s["state"] == "failed", "{s}");
    }
    assert_eq!(
        (disk["count"].as_u64(), disk["example"].as_str()),
        (Some(4), Some("handler exited with status 1: disk full on volume 60")),
        "{disk}"
    );

    // the page: one row per cause; a click lists the group's shards with where they failed
    b.client.goto(&format!("{base}/#/task/rows")).await.unwrap();
    b.until("the causes", PATIENCE, "return document.querySelectorAll('#causes tr.cause').length === 2;").await;
    let first_row =
        b.eval("return [...document.querySelector('#causes tr.cause').cells].map((c) => c.textContent);").await;
    let cells: Vec<String> = serde_json::from_value(first_row).unwrap();
    assert_eq!(cells[0], "60", "{cells:?}");
    assert!(cells[1].ends_with("ValueError: malformed date in row 3"), "{cells:?}");
    assert_eq!(cells[2], "60 failed", "{cells:?}");
    b.client.find(Locator::Css("#causes tr.cause")).await.unwrap().click().await.unwrap();
    let listed = b
        .until(
            "the group's shards",
            PATIENCE,
            "const t = document.querySelector('#causes tr.cause-shards'); \
             return t ? [...t.querySelectorAll(':scope table > tbody > tr')].map((r) => [r.cells[0].textContent, r.cells[2].textContent]) : null;",
        )
        .await;
    let listed: Vec<(String, String)> = serde_json::from_value(listed).unwrap();
    assert_eq!(listed.len(), 60);
    for (i, (shard, node)) in listed.iter().enumerate() {
        assert_eq!(shard, &i.to_string());
        assert!(node == "grp-a" || node == "grp-b", "{listed:?}");
    }
    // it stays open across refreshes
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let still = b.eval("return document.querySelectorAll('#causes tr.cause-shards').length;").await;
    assert_eq!(still, 1);
    b.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_page_shows_where_time_goes_as_the_shards_ran() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-times");
    let (_c, base) = coordinator(&cli, false);
    // ten quick shards (50 ms) and ten slow ones (400 ms)
    let exec = "sh -c 'if [ $SHARDCTL_SHARD_INDEX -lt 10 ]; then sleep 0.05; else sleep 0.4; fi; echo 1'";
    let _e = cli.executor("times-a", &["--exec", exec, "--concurrency", "10"]);
    cli.ok(&["dispatch", "--kind", "timed", "--shards", "20", "--task-id", "timed"]);
    assert_eq!(cli.run(&["wait", "timed", "--timeout", "60s"]).code(), 0);

    // status says it, in text and JSON
    let text = cli.ok(&["status", "timed"]);
    assert!(text.contains("shard times (20 timed): p50 "), "{text}");
    let t = cli.json(&["status", "timed", "--json"], 0);
    let d = &t["durations"];
    let (count, max) = (d["count"].as_u64().unwrap(), d["max_ms"].as_u64().unwrap());
    assert_eq!(count, 20, "{d}");
    assert!((400..5_000).contains(&max), "{d}");
    let (p50, p90) = (d["p50_ms"].as_u64().unwrap(), d["p90_ms"].as_u64().unwrap());
    assert!(p50 >= 40 && p90 >= 300 && p50 <= p90 && p90 <= max, "{d}");
    // the buckets hold the ten quick ones below 300 ms and the ten slow ones above
    let buckets: Vec<(u64, u64, u64)> = d["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["from_ms"].as_u64().unwrap(), b["to_ms"].as_u64().unwrap(), b["count"].as_u64().unwrap()))
        .collect();
    let below: u64 = buckets.iter().filter(|b| b.1 <= 300).map(|b| b.2).sum();
    let above: u64 = buckets.iter().filter(|b| b.0 >= 300).map(|b| b.2).sum();
    assert_eq!((below, above), (10, 10), "{buckets:?}");

    // the page: the same figures, and a bar per bucket with its count
    b.client.goto(&format!("{base}/#/task/timed")).await.unwrap();
    let shown = b
        .until(
            "the histogram",
            PATIENCE,
            "const h = document.getElementById('histogram'); \
             return h ? [...h.children].map((b) => [Number(b.dataset.from), Number(b.dataset.to), Number(b.dataset.count)]) : null;",
        )
        .await;
    let shown: Vec<(u64, u64, u64)> = serde_json::from_value(shown).unwrap();
    assert_eq!(shown, buckets, "the chart's bars are the task's buckets");
    let figures = b.client.find(Locator::Id("durations")).await.unwrap().text().await.unwrap();
    assert!(figures.starts_with("20 shards timed · p50 "), "{figures}");
    // completions over time: every shard in a bucket of the series, and a bar per bucket
    let tp = &t["throughput"];
    let counts: Vec<u64> = tp["counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(counts.iter().sum::<u64>(), 20, "{tp}");
    assert_eq!(tp["width_ms"], 1000, "a task of a second or two keeps 1 s buckets: {tp}");
    let created = t["created_ms"].as_u64().unwrap();
    let start = tp["start_ms"].as_u64().unwrap();
    assert!(start + 1000 > created && start <= t["finished_ms"].as_u64().unwrap(), "{tp} {t}");
    let bars =
        b.eval("return [...document.querySelectorAll('#throughput .bar')].map((b) => Number(b.dataset.count));").await;
    assert_eq!(serde_json::from_value::<Vec<u64>>(bars).unwrap(), counts);
    let heights =
        b.eval("return [...document.querySelectorAll('#histogram .bar i')].map((i) => i.offsetHeight);").await;
    let heights: Vec<u64> = serde_json::from_value(heights).unwrap();
    let tallest = buckets.iter().map(|b| b.2).max().unwrap();
    for (h, bk) in heights.iter().zip(&buckets) {
        // 80 px for the tallest, rounded, at least 2
        let want = ((160 * bk.2 + tallest) / (2 * tallest)).max(2);
        assert_eq!(*h, want, "{heights:?} {buckets:?}");
    }
    b.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_show_their_throughput_and_the_longest_running_shards_in_one_clock() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-exec");
    let (_c, base) = coordinator(&cli, false);
    // shards 0-7 end at once, 8-11 run for a minute
    let exec = "sh -c 'if [ $SHARDCTL_SHARD_INDEX -ge 8 ]; then sleep 60; fi; echo 1'";
    let _e = cli.executor("exa", &["--exec", exec, "--concurrency", "4"]);
    cli.ok(&["dispatch", "--kind", "long", "--shards", "12", "--task-id", "long"]);
    // the executor's heartbeat says what it did and what runs longest
    let mut seen = Value::Null;
    eventually("the executor's counts and running shards", PATIENCE, || {
        let (_, _, body) = http("GET", &format!("{base}/api/queue"), None).map_err(|e| e.to_string())?;
        seen = json(&body)["executors"][0].clone();
        let running: Vec<u64> =
            seen["running"].as_array().into_iter().flatten().filter_map(|r| r["shard"].as_u64()).collect();
        let mut sorted = running.clone();
        sorted.sort_unstable();
        if seen["done"] == 8 && sorted == [8, 9, 10, 11] && seen["running"][0]["running_ms"].as_u64() > Some(1_000) {
            Ok(())
        } else {
            Err(format!("{seen}"))
        }
    });
    assert_eq!((seen["node"].as_str(), seen["failed"].as_u64()), (Some("exa"), Some(0)), "{seen}");
    assert!(seen["running"].as_array().unwrap().iter().all(|r| r["task"] == "long"), "{seen}");
    assert!(seen["up_ms"].as_u64().unwrap() >= seen["running"][0]["running_ms"].as_u64().unwrap(), "{seen}");
    let status = cli.json(&["status", "--json"], 0);
    assert_eq!(status["nodes"][0]["done"], 8, "{status}");
    // `status TASK` names its longest running shards too
    let t = cli.json(&["status", "long", "--json"], 0);
    let longest = t["running_longest"].as_array().unwrap();
    assert_eq!(longest.len(), 4, "{t}");
    assert!(longest.iter().all(|r| r["node"] == "exa" && r["shard"].as_u64() >= Some(8)), "{t}");
    let text = cli.ok(&["status", "long"]);
    assert!(text.contains("running longest: shard "), "{text}");

    // the front page: done, failed, a rounded throughput, how long it has run
    b.client.goto(&format!("{base}/#/")).await.unwrap();
    let row = b
        .until(
            "the executor's row",
            PATIENCE,
            "const r = document.querySelector('tr[data-node=\"exa\"]'); return r ? [...r.cells].map((c) => c.textContent) : null;",
        )
        .await;
    let row: Vec<String> = serde_json::from_value(row).unwrap();
    assert_eq!((row[6].as_str(), row[7].as_str()), ("8", "0"), "{row:?}");
    let throughput = row[8].strip_suffix("/s").unwrap_or_else(|| panic!("{row:?}"));
    let digits = throughput.chars().filter(char::is_ascii_digit).count();
    assert!(throughput.parse::<f64>().is_ok_and(|r| r > 0.0) && digits <= 3, "{row:?}");
    // one clock: UTC, 24 hours, until the viewer asks for the browser's zone
    let updated = b.until("the clock", PATIENCE, "return document.getElementById('updated').textContent;").await;
    let updated = updated.as_str().unwrap().to_owned();
    let hms =
        updated.strip_prefix("updated ").and_then(|u| u.strip_suffix(" UTC")).unwrap_or_else(|| panic!("{updated}"));
    assert!(hms.len() == 8 && hms.split(':').all(|p| p.len() == 2 && p.parse::<u8>().is_ok()), "{updated}");
    b.client.find(Locator::Id("zone")).await.unwrap().click().await.unwrap();
    b.until(
        "the browser's zone",
        PATIENCE,
        "return /^updated \\d\\d:\\d\\d:\\d\\d UTC[+-]\\d\\d:\\d\\d$/.test(document.getElementById('updated').textContent);",
    )
    .await;
    b.client.find(Locator::Id("zone")).await.unwrap().click().await.unwrap();

    // the task page: its longest running shards, where and for how long
    b.client.goto(&format!("{base}/#/task/long")).await.unwrap();
    let rows = b
        .until(
            "the longest running",
            PATIENCE,
            "const h = [...document.querySelectorAll('#times h3')].find((x) => x.textContent === 'Running longest'); \
             const t = h && h.nextElementSibling; \
             return t ? [...t.querySelectorAll('tbody tr')].map((r) => [...r.cells].map((c) => c.textContent)) : null;",
        )
        .await;
    let rows: Vec<Vec<String>> = serde_json::from_value(rows).unwrap();
    let mut shards: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    shards.sort_unstable();
    assert_eq!(shards, ["10", "11", "8", "9"], "{rows:?}");
    assert!(rows.iter().all(|r| r[1] == "exa" && r[2].ends_with('s')), "{rows:?}");
    let created = b
        .eval("const d = [...document.querySelectorAll('dl.spec dt')].find((x) => x.textContent === 'created'); return d.nextElementSibling.textContent;")
        .await;
    assert!(created.as_str().is_some_and(|c| c.ends_with(" UTC")), "{created}");
    cli.ok(&["cancel", "long"]);
    b.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_token_a_retry_from_the_page_completes_the_task() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-retry");
    let (_c, base) = coordinator(&cli, true);
    let dir = std::env::temp_dir().join(format!("shardctl-dash-retry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // fails until the file `ok` exists
    let exec = format!("sh -c 'test -e {}/ok || {{ echo not yet >&2; exit 1; }}; echo 1'", dir.display());
    let _e = cli.executor("dash-e2", &["--exec", &exec]);
    cli.ok(&["dispatch", "--kind", "later", "--shards", "5", "--attempts", "1", "--task-id", "again"]);
    assert_eq!(cli.run(&["wait", "again", "--timeout", "60s"]).code(), 3);

    // the API: no token 401, a wrong one 401, bad input 400, no such task 404; nothing changed
    let url = format!("{base}/api/tasks/again/retry");
    assert_eq!(http("POST", &url, None).unwrap().0, 401);
    assert_eq!(http("POST", &url, Some("wrong-token-0123456789")).unwrap().0, 401);
    assert_eq!(http("POST", &format!("{base}/api/tasks/a:b/retry"), Some(TOKEN)).unwrap().0, 400);
    assert_eq!(http("POST", &format!("{base}/api/tasks/nope/retry"), Some(TOKEN)).unwrap().0, 404);
    assert_eq!(http("GET", &format!("{base}/api/tasks?state=bogus"), None).unwrap().0, 400);
    assert_eq!(http("GET", &format!("{base}/api/tasks/again/map?cells=x"), None).unwrap().0, 400);
    assert_eq!(http("GET", &format!("{base}/api/nothing"), None).unwrap().0, 404);
    assert_eq!(http("DELETE", &format!("{base}/api/queue"), Some(TOKEN)).unwrap().0, 405);
    assert_eq!(cli.json(&["status", "again", "--json"], 0)["state"], "failed");

    // the page: no buttons before the token is given
    b.client.goto(&format!("{base}/#/task/again")).await.unwrap();
    b.until(
        "the task page",
        PATIENCE,
        "const s = document.getElementById('task-id'); return s && s.textContent === 'again';",
    )
    .await;
    assert!(b.client.find_all(Locator::Id("retry")).await.unwrap().is_empty());
    b.client.find(Locator::Id("token")).await.unwrap().send_keys(TOKEN).await.unwrap();
    b.client.find(Locator::Id("token-use")).await.unwrap().click().await.unwrap();
    std::fs::write(dir.join("ok"), "").unwrap();
    b.until("the retry button", PATIENCE, "const r = document.getElementById('retry'); return r && !r.hidden;").await;
    let cancel_hidden = b.eval("return document.getElementById('cancel').hidden;").await;
    assert_eq!(cancel_hidden, true, "cancel is offered for an ended task");
    b.client.find(Locator::Id("retry")).await.unwrap().click().await.unwrap();
    b.until(
        "the task to complete on the page",
        PATIENCE,
        "const s = document.querySelector('h2 .state'); return s && s.textContent === 'completed';",
    )
    .await;
    let t = cli.json(&["status", "again", "--json"], 0);
    assert_eq!(
        (t["state"].as_str(), t["done"].as_u64(), t["failed"].as_u64()),
        (Some("completed"), Some(5), Some(0)),
        "{t}"
    );
    // the token stays out of the URL
    assert!(!b.client.current_url().await.unwrap().as_str().contains(TOKEN));
    b.client.clone().close().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_is_shown_as_text_and_runs_nothing() {
    let Some(b) = Browser::start().await else { return };
    let cli = Cli::start("dash-xss");
    let (_c, base) = coordinator(&cli, false);
    let hostile = r#"<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">"#;
    let exec = format!("sh -c 'echo \"{}\" >&2; exit 1'", hostile.replace('"', "\\\""));
    let _e = cli.executor("dash-e3", &["--exec", &exec]);
    let payload = r#"{"note":"<img src=x onerror=\"window.pwned = 3\">"}"#;
    cli.ok(&[
        "dispatch",
        "--kind",
        "evil",
        "--shards",
        "2",
        "--attempts",
        "1",
        "--task-id",
        "xss",
        "--payload",
        payload,
    ]);
    assert_eq!(cli.run(&["wait", "xss", "--timeout", "60s"]).code(), 3);
    let stored: Vec<String> = redis::cmd("HVALS").arg(cli.key("task:xss:errors")).query(&mut cli.con()).unwrap();
    assert!(stored.iter().all(|r| r.contains("<script>")), "{stored:?}");

    // the events page and the task page both show the text
    b.client.goto(&format!("{base}/#/events")).await.unwrap();
    b.until("the events", PATIENCE, "return document.querySelectorAll('main tbody tr').length > 0;").await;
    b.client.goto(&format!("{base}/#/task/xss")).await.unwrap();
    let shown = b
        .until("the reasons", PATIENCE, "const r = document.querySelector('td.reason'); return r ? r.textContent : '';")
        .await;
    assert!(shown.as_str().unwrap().contains("<script>window.pwned = 1</script>"), "{shown}");
    let payload_shown = b.eval("return document.getElementById('payload').textContent;").await;
    assert!(payload_shown.as_str().unwrap().contains("<img src=x"), "{payload_shown}");
    tokio::time::sleep(Duration::from_millis(1500)).await; // a refresh or two
    assert_eq!(b.eval("return typeof window.pwned;").await, "undefined", "a script from the data ran");
    assert_eq!(b.eval("return document.querySelectorAll('main img, main script').length;").await, 0);
    // every response carries the policy that would stop an injected script anyway
    let (_, head, _) = http("GET", &format!("{base}/"), None).unwrap();
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{head}");
    let (_, head, _) = http("GET", &format!("{base}/api/tasks/xss"), None).unwrap();
    assert!(head.contains("x-content-type-options: nosniff") && head.contains("content-security-policy"), "{head}");
    b.client.clone().close().await.unwrap();
}

/// HKEYS calls the server has answered (of this queue's users, only the shard map sends it).
fn hkeys_calls(cli: &Cli) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut cli.con()).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_hkeys:calls="))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Many viewers of one page cost one read per second: the API answers them from one read.
#[test]
fn many_viewers_share_one_read() {
    let cli = Cli::start("dash-cache");
    let (_c, base) = coordinator(&cli, false);
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "3", "--task-id", "t"]);
    let before = hkeys_calls(&cli);
    // 16 viewers at once on the same shard map
    let answers: Vec<String> = (0..16)
        .map(|_| {
            let base = base.clone();
            std::thread::spawn(move || http("GET", &format!("{base}/api/tasks/t/map"), None).unwrap().2)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let reads = hkeys_calls(&cli) - before;
    let first = json(&answers[0]);
    assert_eq!((first["total"].as_u64(), first["cells"].as_str()), (Some(3), Some("ppp")), "{first}");
    assert!(answers.iter().all(|a| json(a) == first));
    // one read, or two if the burst straddled the end of the answer's second
    assert!((1..=2).contains(&reads), "{reads} reads of the map for 16 viewers");
}

/// An address given with --ui-addr must be free (exit 2, named); a second coordinator on the
/// host, left to the defaults, runs without a dashboard and without metrics and says so.
#[test]
fn a_taken_dashboard_or_metrics_address() {
    let cli = Cli::start("dash-taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = cli.run(&["coordinator", "--metrics-addr", "off", "--ui-addr", &addr]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains(&format!("the dashboard cannot listen on {addr}")), "{out:?}");
    let out = cli.run(&["coordinator", "--ui-addr", "nowhere"]);
    assert_eq!(out.code(), 2, "{out:?}");
    let out = cli.run(&["coordinator", "--metrics-addr", "off", "--ui-token-file", "/nonexistent/token"]);
    assert_eq!(out.code(), 2, "{out:?}");
    assert!(out.stderr.contains("cannot read the token file /nonexistent/token"), "{out:?}");

    // the default addresses (dashboard and metrics): the first coordinator of the host has
    // them (unless something else does), a second one runs without
    let first = cli.background("first", &["--log", "info", "coordinator"]);
    let mut second = cli.background("second", &["--log", "info", "coordinator"]);
    eventually("both coordinators to run", PATIENCE, || {
        let n: u64 = redis::cmd("ZCARD").arg(cli.key("coordinators")).query(&mut cli.con()).unwrap();
        (n == 2).then_some(()).ok_or(format!("{n}\n{}\n{}", first.log(), second.log()))
    });
    let logs = first.log() + &second.log();
    assert!(logs.contains("no dashboard: the dashboard cannot listen on 127.0.0.1:8080"), "{logs}");
    assert!(logs.contains("no metrics: cannot serve metrics on 127.0.0.1:9465"), "{logs}");
    assert!(second.ended().is_none(), "{}", second.log());
}

/// What a hostile or careless client cannot do: read through a rebinding DNS name (421), pass
/// unknown parameters (400), hold a connection open with a partial request (closed), make a
/// shard map read per shard of a huge task; a cancelled task's unrun shards say so.
#[test]
fn the_api_bounds_what_clients_can_make_it_do() {
    let cli = Cli::start("dash-bounds");
    let (_c, base) = coordinator(&cli, false);
    let (status, _, body) = http_as("GET", &format!("{base}/api/queue"), None, Some("rebound.example:80")).unwrap();
    assert_eq!(status, 421, "{body}");
    assert_eq!(http_as("GET", &format!("{base}/api/info"), None, Some("localhost:1")).unwrap().0, 421);
    let port = base.rsplit(':').next().unwrap();
    assert_eq!(http_as("GET", &format!("{base}/api/info"), None, Some(&format!("localhost:{port}"))).unwrap().0, 200);
    let (status, _, body) = http("GET", &format!("{base}/api/queue?cachebuster=1"), None).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown query parameter 'cachebuster'"), "{body}");
    assert_eq!(http("GET", &format!("{base}/api/tasks?limit=0"), None).unwrap().0, 400);
    // counts past the documented bounds are refused too, not cut down in silence
    for path in ["tasks?limit=201", "events?count=201", "tasks/none/map?cells=20001", "tasks/none/failed?count=201"] {
        let (status, _, body) = http("GET", &format!("{base}/api/{path}"), None).unwrap();
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("must be a number from 1 to"), "{path}: {body}");
    }

    // a huge task: its map costs its cells, not its 2^32 shards
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "4294967296", "--task-id", "huge"]);
    let (status, _, body) = http("GET", &format!("{base}/api/tasks/huge/map"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let m = json(&body);
    assert_eq!((m["total"].as_u64(), m["cells"].as_str().map(str::len)), (Some(4_294_967_296), Some(20_000)), "{body}");
    assert!(m["cells"].as_str().unwrap().bytes().all(|c| c == b'p'));

    // cancelled: what never ran is drawn as such
    cli.ok(&["dispatch", "--kind", "noop", "--shards", "5", "--task-id", "stopped"]);
    cli.ok(&["cancel", "stopped"]);
    let m = json(&http("GET", &format!("{base}/api/tasks/stopped/map"), None).unwrap().2);
    assert_eq!(m["cells"], "ccccc", "{m}");

    // a partial request head: the server closes the connection (header read timeout)
    let host = base.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /api/info HTTP/1.1\r\nHost: {host}\r\n").unwrap();
    let mut rest = Vec::new();
    let closed = s.read_to_end(&mut rest);
    assert!(closed.is_ok(), "the connection was not closed: {closed:?}");
}

/// A task over partitions (docs/design/partitions.md) through the API: its shard map
/// has its failed shards in their cells, and its reasons, paged partition after partition, and
/// the events, merged from the partitions' logs, carry the task's own indexes.
#[test]
fn the_api_shows_a_task_over_partitions_at_its_own_indexes() {
    let cli = Cli::start("dash-parts");
    cli.ok(&["config", "--partitions", "3"]);
    let (_c, base) = coordinator(&cli, false);
    let _e = cli.executor("dash-pe", &[]);
    let payload = r#"{"rate":0.3}"#;
    let args =
        ["dispatch", "--kind", "fail", "--payload", payload, "--shards", "60", "--attempts", "1", "--task-id", "pb"];
    cli.ok(&args);
    assert_eq!(cli.run(&["wait", "pb", "--timeout", "60s"]).code(), 3);
    let failed: Vec<u64> = cli
        .json(&["status", "pb", "--failed", "--json"], 0)
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["shard"].as_u64().unwrap())
        .collect();
    assert!(!failed.is_empty() && failed.len() < 60, "{failed:?}");
    // the map: 60 cells, `f` exactly at the failed shards
    let (status, _, body) = http("GET", &format!("{base}/api/tasks/pb/map"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let map = json(&body);
    let cells = map["cells"].as_str().unwrap();
    assert_eq!(cells.len(), 60, "{map}");
    let drawn: Vec<u64> = cells.char_indices().filter(|(_, c)| *c == 'f').map(|(i, _)| i as u64).collect();
    assert_eq!(drawn, failed, "{map}");
    assert!(cells.chars().all(|c| c == 'f' || c == 'd'), "{map}");
    // the reasons, two at a time, through every partition
    let (mut cursor, mut listed) = ("0".to_owned(), Vec::new());
    for _ in 0..200 {
        let (status, _, body) =
            http("GET", &format!("{base}/api/tasks/pb/failed?cursor={cursor}&count=2"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        let page = json(&body);
        listed.extend(page["shards"].as_array().unwrap().iter().map(|s| s["shard"].as_u64().unwrap()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    listed.sort_unstable();
    listed.dedup();
    assert_eq!(listed, failed);
    // a cursor of no partition is a clear 400
    let (status, _, body) = http("GET", &format!("{base}/api/tasks/pb/failed?cursor=9.0"), None).unwrap();
    assert_eq!(status, 400, "{body}");
    // the failures' groups, over every partition, at the task's indexes
    let (status, _, body) = http("GET", &format!("{base}/api/tasks/pb/failures"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let groups = json(&body);
    let mut grouped: Vec<u64> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["shards"].as_array().unwrap().iter().map(|s| s["shard"].as_u64().unwrap()))
        .collect();
    grouped.sort_unstable();
    assert_eq!(grouped, failed, "{groups}");
    // the run times of the completed shards, summed over the shares
    let (status, _, body) = http("GET", &format!("{base}/api/tasks/pb"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let timed = json(&body)["durations"]["count"].as_u64();
    assert_eq!(timed, Some(60 - failed.len() as u64), "{body}");
    // the events merge the partitions' per-shard ones, at the task's indexes, newest first
    let (status, _, body) = http("GET", &format!("{base}/api/events?count=200"), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let events = json(&body);
    let mut shown: Vec<u64> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "shard_failed")
        .map(|e| e["shard"].as_u64().unwrap_or_else(|| panic!("{e}")))
        .collect();
    shown.sort_unstable();
    assert_eq!(shown, failed, "{events}");
    // a per-shard event names its partition's log (an id is unique within one log only)
    let shard_events = events.as_array().unwrap().iter().filter(|e| e["event"] == "shard_failed");
    assert!(shard_events.clone().all(|e| e["partition"].as_u64().is_some()), "{events}");
    let pairs: std::collections::BTreeSet<(u64, &str)> =
        shard_events.clone().map(|e| (e["partition"].as_u64().unwrap(), e["id"].as_str().unwrap())).collect();
    assert_eq!(pairs.len(), shard_events.count(), "{events}");
    let ids: Vec<(u64, u64)> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (ms, n) = e["id"].as_str().unwrap().split_once('-').unwrap();
            (ms.parse().unwrap(), n.parse().unwrap())
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] >= w[1]), "not newest first: {ids:?}");
    assert!(events.as_array().unwrap().iter().any(|e| e["event"] == "task_failed"), "{events}");
}
