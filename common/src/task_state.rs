//! The lifecycle state of a task, as stored in its record's `state`.

use std::str::FromStr;

use serde::Serialize;

use crate::error::Error;

/// The lifecycle state of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Dispatched with a delay: nothing is claimable before its start time.
    Delayed,
    /// Shards are still running or waiting.
    Running,
    /// Every shard is terminal; the aggregation job is queued or running.
    Aggregating,
    /// Every shard completed and the aggregation succeeded.
    Completed,
    /// Some shard failed for good, or the aggregation did.
    Failed,
    /// Cancelled by `shardctl cancel`: no aggregation.
    Cancelled,
}

impl TaskState {
    /// True once the task has ended.
    pub fn is_finished(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Cancelled)
    }
    /// The name stored in Redis.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Delayed => "delayed",
            TaskState::Running => "running",
            TaskState::Aggregating => "aggregating",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

impl FromStr for TaskState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "delayed" => TaskState::Delayed,
            "running" => TaskState::Running,
            "aggregating" => TaskState::Aggregating,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            other => return Err(Error::Protocol(format!("unknown task state '{other}'"))),
        })
    }
}
