//! Cron schedules against a real redis-server, with a simulated clock: racing coordinators create
//! exactly one task per fire time, misfires are skipped or run once, overlapping runs are skipped
//! or allowed, a removed schedule fires no more.

use std::collections::BTreeSet;

use shardctl_common::conn::{self, Conn};
use shardctl_common::model::{TaskSpec, TaskState};
use shardctl_common::schedule::{self, Fired, Misfire, Overlap, Schedule, DEFAULT_MISFIRE_GRACE};
use shardctl_common::Home;
use shardctl_testkit::TestRedis;

/// 2026-11-30T00:00:00Z.
const T0: u64 = 1_795_996_800_000;
const MINUTE: u64 = 60_000;

async fn manager(r: &TestRedis) -> Conn {
    conn::open(&r.url()).unwrap().manager().await.unwrap()
}

fn every_minute(name: &str, overlap: Overlap, misfire: Misfire) -> Schedule {
    schedule_of(name, "* * * * *", overlap, misfire)
}

fn schedule_of(name: &str, cron: &str, overlap: Overlap, misfire: Misfire) -> Schedule {
    let spec = TaskSpec::new("x", "noop", 3);
    Schedule::new(name, cron, "UTC", overlap, misfire, DEFAULT_MISFIRE_GRACE, &spec, T0).unwrap()
}

async fn task_ids(con: &mut Conn, home: &Home) -> Vec<String> {
    redis::cmd("ZRANGE").arg(home.index()).arg(0).arg(-1).query_async(con).await.unwrap()
}

async fn state(con: &mut Conn, home: &Home, id: &str) -> TaskState {
    let s: String = redis::cmd("HGET").arg(home.task(id)).arg("state").query_async(con).await.unwrap();
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn three_coordinators_create_one_task_per_fire_time() {
    let r = TestRedis::start();
    let keys = Home::new("t", "cron").unwrap();
    let mut con = manager(&r).await;
    schedule::add(&mut con, &keys, &every_minute("race", Overlap::Allow, Misfire::Skip), false).await.unwrap();

    // each coordinator ticks every 7 s of simulated time, each with its own phase, over 20
    // minutes: every fire time is seen by several of them, often in the same instant
    let mut tasks = Vec::new();
    for c in 0..3u64 {
        let (mut con, keys) = (manager(&r).await, keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut now = T0 + c * 1_000;
            while now <= T0 + 20 * MINUTE + 30_000 {
                let (done, _) = schedule::tick(&mut con, &keys, now).await.unwrap();
                created.extend(done.into_iter().filter(|d| d.2 == Fired::Created).map(|d| d.1));
                now += 7_000 - c * 2_000 + (now % 3) * 1_000;
                tokio::task::yield_now().await;
            }
            created
        }));
    }
    let mut fired = Vec::new();
    for t in tasks {
        fired.extend(t.await.unwrap());
    }
    fired.sort();
    let expected: Vec<u64> = (1..=20).map(|m| T0 + m * MINUTE).collect();
    assert_eq!(fired, expected, "every fire time created by exactly one coordinator");
    let ids = task_ids(&mut con, &keys).await;
    assert_eq!(ids.len(), 20, "{ids:?}");
    let want: BTreeSet<String> = expected.iter().map(|&t| schedule::task_id("race", t)).collect();
    assert_eq!(ids.into_iter().collect::<BTreeSet<_>>(), want);
    assert!(want.contains("race-20261130T002000Z"), "{want:?}");
}

#[tokio::test]
async fn missed_fire_times_are_skipped_or_run_once() {
    let r = TestRedis::start();
    let keys = Home::new("t", "misfire").unwrap();
    let mut con = manager(&r).await;
    const HOUR: u64 = 60 * MINUTE;
    let hourly = |name, misfire| schedule_of(name, "0 * * * *", Overlap::Allow, misfire);
    schedule::add(&mut con, &keys, &hourly("skip", Misfire::Skip), false).await.unwrap();
    schedule::add(&mut con, &keys, &hourly("once", Misfire::RunOnce), false).await.unwrap();

    // no coordinator for five hours and twenty minutes: five fire times missed, the latest 20
    // minutes ago (past the one-minute grace)
    let now = T0 + 5 * HOUR + 20 * MINUTE;
    let (mut done, next) = schedule::tick(&mut con, &keys, now).await.unwrap();
    done.sort_by(|a, b| a.0.cmp(&b.0));
    let latest = T0 + 5 * HOUR;
    assert_eq!(done, vec![("once".into(), latest, Fired::Created), ("skip".into(), latest, Fired::Missed)]);
    assert_eq!(next, Some(T0 + 6 * HOUR));
    assert_eq!(task_ids(&mut con, &keys).await, vec![schedule::task_id("once", latest)], "run-once: one task");

    // a second coordinator coming up later does not run the missed times again
    let (done, _) = schedule::tick(&mut con, &keys, now + 5_000).await.unwrap();
    assert!(done.is_empty(), "{done:?}");
    // both go on at their next fire time
    let (done, _) = schedule::tick(&mut con, &keys, T0 + 6 * HOUR + 100).await.unwrap();
    assert_eq!(done.iter().filter(|d| d.2 == Fired::Created).count(), 2, "{done:?}");
    // late but within the grace, a fire time still runs under `skip`
    let (done, _) = schedule::tick(&mut con, &keys, T0 + 7 * HOUR + 59_000).await.unwrap();
    assert_eq!(done.iter().filter(|d| d.2 == Fired::Created).count(), 2, "{done:?}");
    assert_eq!(task_ids(&mut con, &keys).await.len(), 5);
}

#[tokio::test]
async fn overlapping_runs_are_skipped_or_allowed() {
    let r = TestRedis::start();
    let keys = Home::new("t", "overlap").unwrap();
    let mut con = manager(&r).await;
    schedule::add(&mut con, &keys, &every_minute("skip", Overlap::Skip, Misfire::Skip), false).await.unwrap();
    schedule::add(&mut con, &keys, &every_minute("allow", Overlap::Allow, Misfire::Skip), false).await.unwrap();

    let outcome = |done: Vec<(String, u64, Fired)>, name: &str| done.into_iter().find(|d| d.0 == name).map(|d| d.2);
    // no executor runs: the first tasks stay unfinished
    let (done, _) = schedule::tick(&mut con, &keys, T0 + MINUTE).await.unwrap();
    assert_eq!(outcome(done.clone(), "skip"), Some(Fired::Created));
    assert_eq!(outcome(done, "allow"), Some(Fired::Created));
    let (done, _) = schedule::tick(&mut con, &keys, T0 + 2 * MINUTE).await.unwrap();
    assert_eq!(outcome(done.clone(), "skip"), Some(Fired::Overlapping), "the first run is unfinished");
    assert_eq!(outcome(done, "allow"), Some(Fired::Created));

    // once the running task ends, the schedule fires again
    let first = schedule::task_id("skip", T0 + MINUTE);
    shardctl_common::control::cancel(&mut con, &keys, &first).await.unwrap();
    assert_eq!(state(&mut con, &keys, &first).await, TaskState::Cancelled);
    let (done, _) = schedule::tick(&mut con, &keys, T0 + 3 * MINUTE).await.unwrap();
    assert_eq!(outcome(done, "skip"), Some(Fired::Created));
    let ids = task_ids(&mut con, &keys).await;
    assert_eq!(ids.iter().filter(|i| i.starts_with("skip-")).count(), 2, "{ids:?}");
    assert_eq!(ids.iter().filter(|i| i.starts_with("allow-")).count(), 3, "{ids:?}");

    // the created task is the template's
    let t = schedule::task_id("allow", T0 + 3 * MINUTE);
    let (kind, total, sched): (String, u64, String) = redis::cmd("HMGET")
        .arg(keys.task(&t))
        .arg("kind")
        .arg("total")
        .arg("schedule")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((kind.as_str(), total, sched.as_str()), ("noop", 3, "allow"));
}

#[tokio::test]
async fn schedules_are_listed_replaced_and_removed() {
    let r = TestRedis::start();
    let keys = Home::new("t", "admin").unwrap();
    let mut con = manager(&r).await;
    let s = every_minute("a", Overlap::Skip, Misfire::Skip);
    schedule::add(&mut con, &keys, &s, false).await.unwrap();
    let e = schedule::add(&mut con, &keys, &s, false).await.unwrap_err().to_string();
    assert!(e.contains("exists") && e.contains("--replace"), "{e}");
    let mut hourly = s.clone();
    hourly.cron = "0 * * * *".into();
    schedule::add(&mut con, &keys, &hourly, true).await.unwrap();
    let all = schedule::list(&mut con, &keys, T0).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].0.cron, "0 * * * *");
    assert_eq!(all[0].1.next_fire_ms, Some(T0 + 60 * MINUTE));

    assert!(schedule::remove(&mut con, &keys, "a").await.unwrap());
    assert!(!schedule::remove(&mut con, &keys, "a").await.unwrap());
    let (done, next) = schedule::tick(&mut con, &keys, T0 + 120 * MINUTE).await.unwrap();
    assert!(done.is_empty() && next.is_none(), "a removed schedule fires no more: {done:?}");
    assert!(task_ids(&mut con, &keys).await.is_empty());
    // a fire racing the removal creates nothing either
    let fired = s.fire(&mut con, &keys, T0 + MINUTE, true).await.unwrap();
    assert_eq!(fired, Fired::AlreadyHandled);
}

#[tokio::test]
async fn a_coordinator_holding_a_replaced_definition_fires_nothing() {
    let r = TestRedis::start();
    let keys = Home::new("t", "stale").unwrap();
    let mut con = manager(&r).await;
    let old = every_minute("s", Overlap::Allow, Misfire::Skip);
    schedule::add(&mut con, &keys, &old, false).await.unwrap();
    // replaced after a coordinator read the old definition, before it fired
    let mut new = schedule_of("s", "*/5 * * * *", Overlap::Allow, Misfire::Skip);
    new.created_ms = T0 + 30_000;
    schedule::add(&mut con, &keys, &new, true).await.unwrap();
    assert_eq!(old.fire(&mut con, &keys, T0 + MINUTE, true).await.unwrap(), Fired::AlreadyHandled);
    assert!(task_ids(&mut con, &keys).await.is_empty());
    assert_eq!(new.fire(&mut con, &keys, T0 + 5 * MINUTE, true).await.unwrap(), Fired::Created);
}
