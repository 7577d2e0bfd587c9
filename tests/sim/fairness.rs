//! Fair sharing and caps in the simulator (docs/design/fairness.md). After every step: each
//! task's count in `held` is the number of its current incarnation's shards held in `active`,
//! each group's the sum of its tasks', and no capped task or group holds more than its cap.
//! After every claim that got fewer shards than it asked for: no runnable pull task of a served
//! kind with fresh shards left was passed over unless it or its group is at its cap (no task
//! starves while it is runnable).

use std::collections::HashMap;

use shardctl_common::kinds::Served;
use shardctl_common::model::{Job, ShardRef};
use shardctl_common::ring::Strategy;

use super::model::State;
use super::world::World;
use super::Outcome;

/// The groups and the group cap of the simulated tasks (`dispatch_id` picks among them).
pub const GROUPS: [&str; 2] = ["ga", "gb"];
/// `config --group-max-running gb=GROUP_CAP` holds throughout.
pub const GROUP_CAP: u64 = 2;

impl World {
    /// The counts against `active`, and the caps.
    pub fn check_fair(&self) -> Outcome {
        let mut held: HashMap<String, u64> = HashMap::new();
        for r in self.snap.active.keys() {
            let sr: ShardRef = r.parse().map_err(|e| format!("held ref {r}: {e}"))?;
            let current = self.snap.tasks.get(&sr.task).is_some_and(|v| v.num("seq") == sr.seq);
            if matches!(sr.job, Job::Shard(_)) && current {
                *held.entry(sr.task).or_default() += 1;
            }
        }
        let mut groups: HashMap<String, u64> = HashMap::new();
        for id in &self.ids {
            let n = held.get(id).copied().unwrap_or(0);
            let counted = self.snap.held.get(id).copied().unwrap_or(0);
            ensure!(counted == n, "`held` counts {counted} for {id}, `active` holds {n} of it");
            let v = &self.snap.tasks[id];
            if let Some(cap) = v.hash.get("max_running").and_then(|c| c.parse::<u64>().ok()) {
                ensure!(n <= cap, "{id} holds {n} shards, its cap is {cap}");
            }
            if let Some(g) = v.hash.get("group") {
                *groups.entry(g.clone()).or_default() += n;
            }
        }
        for g in GROUPS {
            let n = groups.get(g).copied().unwrap_or(0);
            let counted = self.snap.held.get(&format!("g:{g}")).copied().unwrap_or(0);
            ensure!(counted == n, "`held` counts {counted} for group {g}, its tasks hold {n}");
        }
        let gb = groups.get("gb").copied().unwrap_or(0);
        ensure!(gb <= GROUP_CAP, "group gb holds {gb} shards, its cap is {GROUP_CAP}");
        Ok(())
    }

    /// After a claim by an executor serving `served` that got fewer than it asked for (the
    /// snapshot read after it): every runnable pull task of a served kind with fresh shards left
    /// is at its cap or its group's.
    pub fn check_none_passed_over(&self, served: &Served) -> Outcome {
        if self.model.paused {
            return Ok(());
        }
        let gb = self.snap.held.get("g:gb").copied().unwrap_or(0);
        for id in &self.ids {
            let Some(tm) = self.model.tasks.get(id) else { continue };
            let v = &self.snap.tasks[id];
            if tm.state != State::Running || tm.strategy != Strategy::Pull || !served.serves(&tm.kind) {
                continue;
            }
            if v.hash.get("state").map(String::as_str) != Some("running") || v.num("cursor") >= v.num("total") {
                continue;
            }
            let n = self.snap.held.get(id).copied().unwrap_or(0);
            let capped = v.hash.get("max_running").and_then(|c| c.parse::<u64>().ok()).is_some_and(|c| n >= c);
            let group_capped = v.hash.get("group").is_some_and(|g| g == "gb") && gb >= GROUP_CAP;
            ensure!(
                capped || group_capped,
                "a claim got fewer than it asked for, yet {id} has fresh shards ({} of {}), holds {n} and is under its caps",
                v.num("cursor"),
                v.num("total")
            );
        }
        Ok(())
    }
}
