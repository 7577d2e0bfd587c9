//! One clock (docs/design/clock.md): every time the scripts store or compare is the Redis
//! server's (`TIME`), never a caller's. Issue 11, defect 5: membership scores used the node's
//! clock and reaping the rebalancer's (a node lagging more than its member timeout was reaped at
//! every rebalance), retry due times and `--delay` starts whoever's clock ran the script, and
//! reaping read stale nodes and removed them in a second step (a node beating in between was
//! deleted while alive). Each check brackets a script call with the server's clock.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::time::Duration;

use shardctl_common::model::TaskSpec;
use shardctl_common::scripts;
use shardctl_common::time::server_now_ms;
use support::ScriptEnv;

const LONG_LOCK: u64 = 60_000;

async fn server_ms(env: &mut ScriptEnv) -> u64 {
    server_now_ms(&mut env.con, &env.keys).await.unwrap()
}

#[tokio::test]
async fn delays_and_retries_are_due_by_the_servers_clock() {
    let mut env = ScriptEnv::start("clock_due").await;
    let mut spec = TaskSpec::new("d", "noop", 1);
    spec.delay = Some(Duration::from_millis(400));
    let before = server_ms(&mut env).await;
    env.dispatch(&spec).await;
    let after = server_ms(&mut env).await;
    let start: u64 = env.field("d", "start_ms").await.unwrap().parse().unwrap();
    assert!((before + 400..=after + 400).contains(&start), "start {start} not 400 ms after [{before}, {after}]");
    let early = env.claim("a", 0, 1, LONG_LOCK).await;
    assert!(early.shards.is_empty());
    let due = early.next_due_in_ms.expect("the delayed task's start, from now");
    assert!((1..=400).contains(&due), "{due}");
    tokio::time::sleep(Duration::from_millis(due + 20)).await;
    let c = env.claim("a", 1, 1, LONG_LOCK).await.shards.remove(0);

    let before = server_ms(&mut env).await;
    assert_eq!(env.fail(&c, 5_000, "later").await, Ok(2));
    let after = server_ms(&mut env).await;
    let at: Option<u64> = env.cmd(redis::cmd("ZSCORE").arg(env.keys.delayed()).arg(c.shard_ref.to_string())).await;
    let at = at.expect("the retry waits in `delayed`");
    assert!((before + 5_000..=after + 5_000).contains(&at), "retry due {at} not 5 s after [{before}, {after}]");
}

#[tokio::test]
async fn membership_is_scored_and_reaped_by_the_servers_clock_in_one_step() {
    let mut env = ScriptEnv::start("clock_members").await;
    let before = server_ms(&mut env).await;
    for (node, timeout) in [("a", 10_000u64), ("b", 10_000), ("c", 10_000)] {
        let joined = scripts::join(&mut env.con, &env.keys, node, node, timeout, None, &[]).await.unwrap();
        assert!(joined.is_ok());
    }
    let after = server_ms(&mut env).await;
    let scores: Vec<(String, u64)> =
        env.cmd(redis::cmd("ZRANGE").arg(env.keys.nodes()).arg(0).arg(-1).arg("WITHSCORES")).await;
    for (n, s) in &scores {
        assert!((before + 10_000..=after + 10_000).contains(s), "node {n}: alive until {s}");
    }
    // b's membership ran out by the server's clock (as if it stopped beating 10 s ago)
    env.cmd::<()>(redis::cmd("ZADD").arg(env.keys.nodes()).arg(before - 1).arg("b")).await;
    let r = scripts::reap(&mut env.con, &env.keys).await.unwrap();
    assert_eq!((r.departed, r.live), (vec!["b".to_owned()], vec!["a".to_owned(), "c".to_owned()]));
    let gone: u64 = env.cmd(redis::cmd("EXISTS").arg(env.keys.node("b"))).await;
    assert_eq!(gone, 0, "the departed node's hash goes in the same call");
    let kept: u64 = env.cmd(redis::cmd("EXISTS").arg(env.keys.node("a"))).await;
    assert_eq!(kept, 1);
    // nothing else to reap
    let r = scripts::reap(&mut env.con, &env.keys).await.unwrap();
    assert!(r.departed.is_empty(), "{r:?}");
}
