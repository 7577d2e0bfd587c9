//! The aggregation's read in the partition simulator, through the real layer: what the
//! executor's aggregation does before it hands a task's outcomes to the aggregator
//! (`executor::aggregate::outcomes`). Every share of the task is checked
//! (`share::check_counted`), its results and reasons are read, and every share is checked again;
//! a share found `Lost` has its count forgotten (`uncount.lua`, by the job's holder) and the job
//! is withdrawn, one found `Incomplete` withdraws it too. Now and then the share being read
//! loses its last completion (`lose`) or its slot rolls back between its results and its
//! reasons, as a failover of its master in the middle of the read does: the second check is
//! there for that.
//!
//! What two sound checks let through must be the whole task and the right answer: an outcome
//! for every shard, and every result the one made by an executor running the home's dispatch
//! (its payload's nonce). A read that would hand the aggregator a hole or another dispatch's
//! result is a violation.

use std::collections::HashMap;

use shardctl_common::model::TaskInfo;
use shardctl_common::scripts::{self, Claimed};
use shardctl_common::share::{self, Counted};

use super::{faults, shard_result, Sim, ROLLBACKS};

/// Percent of share reads with a failover of the share's master in their middle.
const MID_READ_FAULT: u64 = 20;

impl Sim {
    /// The aggregation of claim `c` reads its task: true when its outcomes were read whole and
    /// right (the job may complete), false when it was withdrawn. At step `n` (`None`: the
    /// drain, where nothing rolls back).
    pub async fn aggregation_reads(&mut self, c: &Claimed, n: Option<u64>) -> Result<bool, String> {
        let home = self.layout.home.clone();
        let id = c.shard_ref.task.clone();
        let h: HashMap<String, String> =
            redis::cmd("HGETALL").arg(home.task(&id)).query_async(&mut self.con).await.map_err(|e| e.to_string())?;
        let Some(t) = TaskInfo::from_hash(&id, &h).map_err(|e| e.to_string())? else {
            // no home: the completion is refused
            return Ok(true);
        };
        if t.seq != c.shard_ref.seq {
            // another incarnation's job: the completion is refused
            return Ok(true);
        }
        let nonce = faults::nonce_of(h.get("payload"));
        let shares = share::of(&mut self.con, &home, &t).await.map_err(|e| e.to_string())?;
        let (mut results, mut errors) = (HashMap::new(), HashMap::new());
        // the shards that ended, by their terminal bits (a settled task's others were cancelled;
        // a reason without its bit is a retry's)
        let mut ended = std::collections::HashSet::new();
        for pass in 0..2 {
            for s in &shares {
                match share::check_counted(&mut self.con, &home, &t, s).await.map_err(|e| e.to_string())? {
                    Counted::Sound => {}
                    Counted::Lost(what) => {
                        let r = scripts::uncount(&mut self.con, &home, &id, &t.inc, s.partition, &c.token)
                            .await
                            .map_err(|e| format!("uncount: {e}"))?;
                        self.note(format!(
                            "aggregation of {} (check {pass}): share {} {what}: uncount {r}",
                            c.shard_ref, s.partition
                        ));
                        return Ok(false);
                    }
                    Counted::Cancelled => {
                        let r = shardctl_common::control::cancel(&mut self.con, &home, &id).await;
                        self.note(format!(
                            "aggregation of {} (check {pass}): share {} cancelled: the task is cancelled again: {r:?}",
                            c.shard_ref, s.partition
                        ));
                        r.map_err(|e| format!("cancel: {e}"))?;
                        return Ok(false);
                    }
                    Counted::Incomplete(why) => {
                        self.note(format!(
                            "aggregation of {} (check {pass}): share {} incomplete: {why}",
                            c.shard_ref, s.partition
                        ));
                        return Ok(false);
                    }
                }
                if pass == 1 {
                    continue;
                }
                let r: HashMap<u64, String> = redis::cmd("HGETALL")
                    .arg(s.keys.results(&id))
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                if let Some(n) = n.filter(|_| self.rng.chance(MID_READ_FAULT)) {
                    // a failover of the share's master in the middle of the read: its last
                    // completion lost, or (rollbacks on) its slot a few steps back
                    if ROLLBACKS && self.rng.chance(50) {
                        let steps = 1 + self.rng.below(faults::DEPTH);
                        self.note(format!("aggregation of {}: share {} rolls back mid-read", c.shard_ref, s.partition));
                        self.roll_back(n, s.partition as usize, steps).await?;
                    } else {
                        self.note(format!(
                            "aggregation of {}: share {} loses writes mid-read",
                            c.shard_ref, s.partition
                        ));
                        self.lose(&id, s.partition).await?;
                    }
                }
                let e: HashMap<u64, String> = redis::cmd("HGETALL")
                    .arg(s.keys.errors(&id))
                    .query_async(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?;
                let bits: Vec<u8> = redis::cmd("GET")
                    .arg(s.keys.terminal(&id))
                    .query_async::<Option<Vec<u8>>>(&mut self.con)
                    .await
                    .map_err(|e| e.to_string())?
                    .unwrap_or_default();
                for i in 0..s.size {
                    if bits.get((i / 8) as usize).is_some_and(|b| b & (0x80 >> (i % 8)) != 0) {
                        ended.insert(s.base + i);
                    }
                }
                let local = |m: HashMap<u64, String>| m.into_iter().filter(|(i, _)| *i < s.size);
                results.extend(local(r).map(|(i, v)| (s.base + i, (i, v))));
                errors.extend(local(e).map(|(i, v)| (s.base + i, v)));
            }
        }
        // what two sound checks let through: every shard's outcome (but the shards a settled
        // task cancelled, exactly as many as it counts), each result this dispatch's
        let mut missing = 0;
        for i in 0..t.total {
            if t.cancelled.is_some() && !ended.contains(&i) {
                missing += 1;
                continue;
            }
            match (results.get(&i), errors.get(&i)) {
                (None, None) => {
                    return Err(format!(
                        "the aggregation of {} read no outcome of shard {i} although every share checked sound twice",
                        c.shard_ref
                    ))
                }
                (Some((local, r)), None) => {
                    let want = shard_result(nonce, *local);
                    if *r != want {
                        return Err(format!(
                            "the aggregation of {} read result {r} for shard {i}, not this dispatch's {want}",
                            c.shard_ref
                        ));
                    }
                }
                (_, Some(_)) => {}
            }
        }
        if missing != t.cancelled.unwrap_or(0) {
            return Err(format!(
                "the aggregation of {} read no outcome of {missing} shards, its task counts {:?} cancelled",
                c.shard_ref, t.cancelled
            ));
        }
        self.note(format!("aggregation of {} read {} shards whole", c.shard_ref, t.total));
        Ok(true)
    }
}
