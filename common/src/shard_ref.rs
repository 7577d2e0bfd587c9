//! A ref: the name of a shard or of an aggregation job in lists and `active`,
//! `<task>:<seq>:<index>` or `<task>:<seq>:agg` (docs/design/identity.md).

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Which job of a task a ref names: one of its shards, or its aggregation job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// Shard number i (0-based).
    Shard(u64),
    /// The aggregation job `<task>:<seq>:agg`.
    Aggregate,
}

/// A ref `<task>:<seq>:<index>` or `<task>:<seq>:agg`: `seq` numbers the task's incarnation in
/// its slot, so that nothing of an earlier task under the same id is taken for this one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardRef {
    /// The task id.
    pub task: String,
    /// The task's incarnation in its slot: the queue's submission number when it was dispatched.
    pub seq: u64,
    /// Which job of the task.
    pub job: Job,
}

impl ShardRef {
    /// The ref of shard `index` of incarnation `seq` of `task`.
    pub fn shard(task: &str, seq: u64, index: u64) -> Self {
        ShardRef { task: task.to_owned(), seq, job: Job::Shard(index) }
    }
    /// The aggregation job of incarnation `seq` of `task`.
    pub fn aggregate(task: &str, seq: u64) -> Self {
        ShardRef { task: task.to_owned(), seq, job: Job::Aggregate }
    }
    /// True for the aggregation job.
    pub fn is_aggregate(&self) -> bool {
        self.job == Job::Aggregate
    }
}

impl fmt::Display for ShardRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.job {
            Job::Shard(i) => write!(f, "{}:{}:{i}", self.task, self.seq),
            Job::Aggregate => write!(f, "{}:{}:agg", self.task, self.seq),
        }
    }
}

impl FromStr for ShardRef {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Protocol(format!("malformed shard ref '{s}'"));
        let (rest, job) = s.rsplit_once(':').ok_or_else(bad)?;
        let (task, seq) = rest.rsplit_once(':').ok_or_else(bad)?;
        if task.is_empty() || task.contains(':') {
            return Err(bad());
        }
        let job = match job {
            "agg" => Job::Aggregate,
            n => Job::Shard(n.parse().map_err(|_| bad())?),
        };
        Ok(ShardRef { task: task.to_owned(), seq: seq.parse().map_err(|_| bad())?, job })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_round_trip() {
        for r in [ShardRef::shard("t.1", 7, 42), ShardRef::aggregate("x-y", 1)] {
            assert_eq!(r.to_string().parse::<ShardRef>().unwrap(), r);
        }
        assert!("nocolon".parse::<ShardRef>().is_err());
        assert!("t:x".parse::<ShardRef>().is_err());
        assert!("t:1".parse::<ShardRef>().is_err(), "a ref without its incarnation");
        assert!("a:b:1:2".parse::<ShardRef>().is_err(), "task ids have no colon");
    }
}
