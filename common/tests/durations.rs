//! Shards' run times at the level of the scripts (docs/design/dashboard.md, "Where time goes"),
//! against a real redis-server: a counted completion adds its run time to its task's histogram,
//! once; a completion refused or repeated, a failure and a completion without a run time add
//! nothing; the histogram reads back as the percentiles `status` shows.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use shardctl_common::durations::Histogram;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimRequest, Finished, FinishedAs};
use shardctl_common::ScriptCode;
use support::ScriptEnv;

const LOCK: u64 = 60_000;

#[tokio::test]
async fn counted_completions_add_their_run_times_once() {
    let mut env = ScriptEnv::start("durations").await;
    env.dispatch(&TaskSpec::new("t", "noop", 6)).await;
    let held = env.claim("a", 1, 6, LOCK).await.shards;
    // five completions with run times (10 ms to 10 s), in one call; one without
    let runs = [10u64, 20, 40, 80, 10_000];
    let items: Vec<Finished<'_>> = held[..5]
        .iter()
        .zip(runs)
        .map(|(c, ms)| Finished { claim: c, outcome: FinishedAs::Completed(""), ran_ms: Some(ms) })
        .collect();
    let key = env.keys.clone();
    let codes = scripts::finish(&mut env.con, &key, "n", &items).await.unwrap();
    assert!(codes.iter().all(|c| *c == Ok(1)), "{codes:?}");
    // the same completions again (a lost reply): refused, nothing added
    let again = scripts::finish(&mut env.con, &key, "n", &items).await.unwrap();
    assert!(again.iter().all(|c| *c == Err(ScriptCode::LockMissing)), "{again:?}");
    let untimed = [Finished { claim: &held[5], outcome: FinishedAs::Completed(r#"{"v":1}"#), ran_ms: None }];
    assert_eq!(scripts::finish(&mut env.con, &key, "n", &untimed).await.unwrap(), vec![Ok(1)]);
    let h = Histogram::from_hash(&env.task("t").await);
    let s = h.summary().expect("timed");
    assert_eq!((s.count, s.max_ms), (5, 10_000));
    assert!((17..=23).contains(&s.p50_ms) || (34..=46).contains(&s.p50_ms), "{s:?}");
    assert_eq!(s.p99_ms, 10_000, "the slowest, capped at the max: {s:?}");

    // riding on a claim (complete_and_claim) counts too; a failure adds nothing
    env.dispatch(&TaskSpec::new("u", "noop", 2)).await;
    // (the claim also hands out t's aggregation job)
    let u: Vec<_> = env.claim("b", 1, 3, LOCK).await.shards.into_iter().filter(|c| c.shard_ref.task == "u").collect();
    assert_eq!(u.len(), 2);
    let done = [Finished { claim: &u[0], outcome: FinishedAs::Completed(""), ran_ms: Some(300) }];
    let req = ClaimRequest {
        count: 1,
        lock_ms: LOCK,
        instance: "b",
        seq: 2,
        node: "n",
        ahead: 0,
        speeds: None,
        kinds: &shardctl_common::kinds::Served::Every,
    };
    let (codes, _) = scripts::complete_and_claim(&mut env.con, &key, &done, &req).await.unwrap();
    assert_eq!(codes, vec![Ok(1)]);
    let failed = FinishedAs::Failed { delay_ms: 0, reason: "x", failure: shardctl_common::failure::Failure::Permanent };
    let f = [Finished { claim: &u[1], outcome: failed, ran_ms: Some(5) }];
    assert_eq!(scripts::finish(&mut env.con, &key, "n", &f).await.unwrap(), vec![Ok(1)]);
    let th = env.task("u").await;
    let s = Histogram::from_hash(&th).summary().unwrap_or_else(|| panic!("untimed: {th:?}"));
    assert_eq!((s.count, s.max_ms, s.histogram.len()), (1, 300, 1));
    let b = &s.histogram[0];
    assert!(b.from_ms <= 300 && 300 < b.to_ms, "{b:?}");
}

#[tokio::test]
async fn completions_over_time_widen_their_buckets_and_keep_every_count() {
    use shardctl_common::throughput::{Series, BUCKETS};
    let mut env = ScriptEnv::start("throughput").await;
    env.dispatch(&TaskSpec::new("t", "noop", 40)).await;
    let held = env.claim("a", 1, 40, LOCK).await.shards;
    let key = env.keys.clone();
    let done = |c| Finished { claim: c, outcome: FinishedAs::Completed(""), ran_ms: None };
    // ten completions now: one bucket of 1 s
    let first: Vec<Finished<'_>> = held[..10].iter().map(done).collect();
    scripts::finish(&mut env.con, &key, "n", &first).await.unwrap();
    let s = Series::from_hash(&env.task("t").await).expect("a series");
    assert_eq!((s.width_ms, s.counts.clone()), (1000, vec![10]));
    // as if the first had been 200 s ago: the next completions fall past 64 buckets of 1 s, so
    // neighbours merge until 200 s fits (4 s buckets: 50 of them), and nothing is lost
    let back = s.start_ms - 200_000;
    let () = env.cmd(redis::cmd("HSET").arg(key.task("t")).arg("tp_t0").arg(back)).await;
    let rest: Vec<Finished<'_>> = held[10..].iter().map(done).collect();
    scripts::finish(&mut env.con, &key, "n", &rest).await.unwrap();
    let h = env.task("t").await;
    let s = Series::from_hash(&h).expect("a series");
    assert_eq!((s.start_ms, s.width_ms, s.total()), (back, 4000, 40), "{h:?}");
    assert_eq!((s.counts[0], *s.counts.last().unwrap()), (10, 30), "{s:?}");
    assert!(s.counts.len() <= BUCKETS, "{s:?}");
    let fields = h.keys().filter(|k| k.starts_with("tp")).count();
    assert!(fields <= BUCKETS + 2, "{h:?}");
}

#[tokio::test]
async fn two_groups_of_one_task_in_one_call_keep_the_longest() {
    let mut env = ScriptEnv::start("durations-groups").await;
    env.dispatch(&TaskSpec::new("t", "noop", 4)).await;
    // two claims (two tokens: two groups of one call), the first with the longest run
    let a = env.claim("a", 1, 2, LOCK).await.shards;
    let b = env.claim("b", 1, 2, LOCK).await.shards;
    let items: Vec<Finished<'_>> = [(&a[0], 500), (&a[1], 20), (&b[0], 300), (&b[1], 30)]
        .into_iter()
        .map(|(c, ms)| Finished { claim: c, outcome: FinishedAs::Completed(""), ran_ms: Some(ms) })
        .collect();
    let key = env.keys.clone();
    let codes = scripts::finish(&mut env.con, &key, "n", &items).await.unwrap();
    assert!(codes.iter().all(|c| *c == Ok(1)), "{codes:?}");
    let s = Histogram::from_hash(&env.task("t").await).summary().expect("timed");
    assert_eq!((s.count, s.max_ms), (4, 500), "{s:?}");
    let series = shardctl_common::throughput::Series::from_hash(&env.task("t").await).expect("a series");
    assert_eq!(series.total(), 4);
}
