//! Lanes (docs/design/lanes.md) at the level of the scripts, against a real
//! redis-server: a claim takes only the kinds it serves, a kind listed twice is read once, and
//! what a version before lanes queued in `wait` and `tasks` reaches the lanes.

// the helpers are shared with invariants.rs, which uses all of them
#[allow(dead_code)]
mod support;

use std::collections::HashSet;

use shardctl_common::kinds::Served;
use shardctl_common::model::TaskSpec;
use shardctl_common::scripts::{self, ClaimRequest};
use support::ScriptEnv;

fn spec(id: &str, kind: &str, shards: u64) -> TaskSpec {
    let mut s = TaskSpec::new(id, kind, shards);
    s.retain = None;
    s
}

async fn claim(env: &mut ScriptEnv, seq: u64, count: usize, kinds: &Served) -> Vec<String> {
    let req = ClaimRequest { count, lock_ms: 60_000, instance: "e", seq, node: "n1", ahead: 0, speeds: None, kinds };
    let out = scripts::claim(&mut env.con, &env.keys, &req).await.expect("claim");
    out.shards.iter().map(|c| c.shard_ref.to_string()).collect()
}

#[tokio::test]
async fn a_claim_takes_only_the_kinds_it_serves_and_each_lane_once() {
    let mut env = ScriptEnv::start("lanes_served").await;
    env.dispatch(&spec("a", "ka", 3)).await;
    env.dispatch(&spec("b", "kb", 3)).await;
    // a kind listed twice: its cursor is read once, its indexes handed out once
    let twice = Served::Only(vec!["kb".into(), "kb".into()]);
    let got = claim(&mut env, 1, 10, &twice).await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|r| r.starts_with("b:")), "{got:?}");
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 3, "{got:?}");
    // nothing of kb is left, and a kb claim takes nothing of ka
    assert!(claim(&mut env, 2, 10, &Served::parse("kb").unwrap()).await.is_empty());
    let every = claim(&mut env, 3, 10, &Served::Every).await;
    assert_eq!(every.len(), 3, "{every:?}");
    assert!(every.iter().all(|r| r.starts_with("a:")), "{every:?}");
}

#[tokio::test]
async fn what_an_older_version_queued_reaches_the_lanes() {
    let mut env = ScriptEnv::start("lanes_legacy").await;
    env.dispatch(&spec("t", "kx", 4)).await;
    // as a version before lanes would have left it: the task in `tasks`, a ref in `wait`
    let inc: String = env.cmd(redis::cmd("HGET").arg(env.keys.task("t")).arg("seq")).await;
    let score: f64 = env.cmd(redis::cmd("ZSCORE").arg(env.keys.lane_tasks("kx")).arg("t")).await;
    env.cmd::<()>(redis::cmd("ZREM").arg(env.keys.lane_tasks("kx")).arg("t")).await;
    env.cmd::<()>(redis::cmd("ZADD").arg(env.keys.legacy_tasks()).arg(score).arg("t")).await;
    env.cmd::<()>(redis::cmd("HSET").arg(env.keys.task("t")).arg("cursor").arg(1)).await;
    env.cmd::<()>(redis::cmd("RPUSH").arg(env.keys.legacy_wait()).arg(format!("t:{inc}:0")).arg("gone:1:0")).await;
    assert!(claim(&mut env, 1, 10, &Served::parse("kx").unwrap()).await.is_empty(), "nothing in the lanes yet");
    assert_eq!(scripts::move_legacy(&mut env.con, &env.keys).await.unwrap(), 2);
    let mut got = claim(&mut env, 2, 10, &Served::parse("kx").unwrap()).await;
    got.sort();
    assert_eq!(got, (0..4).map(|i| format!("t:{inc}:{i}")).collect::<Vec<_>>());
    let left: u64 = env.cmd(redis::cmd("EXISTS").arg(env.keys.legacy_wait()).arg(env.keys.legacy_tasks())).await;
    assert_eq!(left, 0, "the old keys are gone");
    assert_eq!(scripts::move_legacy(&mut env.con, &env.keys).await.unwrap(), 0);
}
