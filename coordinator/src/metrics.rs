//! The coordinator's Prometheus metrics, each described once here. The library only calls the
//! `metrics` facade (a no-op until a recorder is installed); the binary installs the exporter and
//! calls [`describe`].
//!
//! - The sweep's counters ([`STALLED_RECOVERED`], [`STALLED_FAILED`], label `queue`) count what
//!   the sweeps run by *this* process did: every executor and the coordinator daemon sweep, one
//!   sweep per interval across all of them, so sum them over processes.
//! - The progress gauges are set by the coordinator daemon ([`crate::daemon`]) every refresh from
//!   what Redis holds: per task (labels `queue`, `task`, `kind`) for the running tasks and those
//!   finished within the retention; per group of tasks (labels `queue`, `group`); per queue
//!   (label `queue`).
//!
//! How a finished task leaves the metrics: once it is out of the retention the daemon stops
//! setting its gauges, and the exporter (installed with an idle timeout of three refreshes for
//! gauges) drops them. The exporter judges idleness when it renders: a gauge goes when a scrape
//! finds it unchanged since an earlier scrape more than the idle timeout before. With Prometheus
//! scraping every S, a task's label set is gone at most retention + 4 refreshes + 2·S after the
//! task ended (the last scrapes show its final values). The gauges are therefore set through the macros on every
//! refresh, never through held handles: a handle held past its removal would update a series
//! that is no longer exported.

use metrics::{describe_counter, describe_gauge, Counter, Label};

use crate::snapshot::Snapshot;

/// Counter: stalled shards put back to be claimed again by this process's sweeps.
pub const STALLED_RECOVERED: &str = "shardctl_stalled_recovered_total";
/// Counter: stalled shards failed for good (stalled too often) by this process's sweeps.
pub const STALLED_FAILED: &str = "shardctl_stalled_failed_total";
/// Gauge: shards of a task (not `_total`: that suffix is for counters, and `promtool check
/// metrics` refuses it on a gauge).
pub const TASK_SHARDS: &str = "shardctl_task_shards";
/// Gauge: shards of a task completed.
pub const TASK_SHARDS_DONE: &str = "shardctl_task_shards_done";
/// Gauge: shards of a task failed for good.
pub const TASK_SHARDS_FAILED: &str = "shardctl_task_shards_failed";
/// Gauge: terminal shards of a task over its total, 0 to 1.
pub const TASK_PROGRESS_RATIO: &str = "shardctl_task_progress_ratio";
/// Gauge: shards ready to be claimed now.
pub const QUEUE_WAITING: &str = "shardctl_queue_waiting";
/// Gauge: shards being run.
pub const QUEUE_ACTIVE: &str = "shardctl_queue_active";
/// Gauge: shards waiting for a retry or for their task's start (`--delay`).
pub const QUEUE_DELAYED: &str = "shardctl_queue_delayed";
/// Gauge: 1 while the queue is paused (no claims), else 0.
pub const QUEUE_PAUSED: &str = "shardctl_queue_paused";
/// Gauge: tasks not finished.
pub const QUEUE_RUNNING_TASKS: &str = "shardctl_queue_running_tasks";
/// Gauge: tasks that ended failed within the retention.
pub const QUEUE_FAILED_TASKS: &str = "shardctl_queue_failed_tasks";
/// Gauge: executors whose membership heartbeat is within the member timeout.
pub const EXECUTORS_LIVE: &str = "shardctl_executors_live";
/// Gauge: shards a group's tasks hold (label `group`; docs/design/fairness.md).
pub const GROUP_RUNNING: &str = "shardctl_group_running";
/// Gauge: shards of a group's running tasks not handed out yet.
pub const GROUP_WAITING: &str = "shardctl_group_waiting";

/// Describes every metric of the coordinator to the installed recorder (call once, after
/// installing it).
pub fn describe() {
    describe_counter!(STALLED_RECOVERED, "Stalled shards put back to be claimed again by this process's sweeps.");
    describe_counter!(STALLED_FAILED, "Stalled shards failed for good by this process's sweeps.");
    describe_gauge!(TASK_SHARDS, "Shards of a task (running, or finished within the retention).");
    describe_gauge!(TASK_SHARDS_DONE, "Shards of a task completed.");
    describe_gauge!(TASK_SHARDS_FAILED, "Shards of a task failed for good.");
    describe_gauge!(TASK_PROGRESS_RATIO, "Terminal shards of a task over its total, 0 to 1.");
    describe_gauge!(QUEUE_WAITING, "Shards ready to be claimed now.");
    describe_gauge!(QUEUE_ACTIVE, "Shards being run.");
    describe_gauge!(QUEUE_DELAYED, "Shards waiting for a retry or for their task's start (--delay).");
    describe_gauge!(QUEUE_PAUSED, "1 while the queue is paused (shardctl pause: no claims), else 0.");
    describe_gauge!(QUEUE_RUNNING_TASKS, "Tasks not finished.");
    describe_gauge!(QUEUE_FAILED_TASKS, "Tasks that ended failed within the retention.");
    describe_gauge!(GROUP_RUNNING, "Shards a group's tasks hold: running, or claimed to start next.");
    describe_gauge!(GROUP_WAITING, "Shards of a group's running tasks not handed out yet.");
    describe_gauge!(EXECUTORS_LIVE, "Executors whose membership heartbeat is within the member timeout.");
}

/// The sweep's counters of one queue.
pub(crate) struct SweepMetrics {
    pub(crate) recovered: Counter,
    pub(crate) failed: Counter,
}

impl SweepMetrics {
    pub(crate) fn new(queue: &str) -> Self {
        let labels = vec![Label::new("queue", queue.to_owned())];
        SweepMetrics {
            recovered: metrics::counter!(STALLED_RECOVERED, labels.clone()),
            failed: metrics::counter!(STALLED_FAILED, labels),
        }
    }
}

/// Sets the progress gauges of queue `queue` from one reading.
pub fn publish(queue: &str, s: &Snapshot) {
    let q = queue.to_owned();
    for t in &s.tasks {
        let labels =
            vec![Label::new("queue", q.clone()), Label::new("task", t.id.clone()), Label::new("kind", t.kind.clone())];
        metrics::gauge!(TASK_SHARDS, labels.clone()).set(t.total as f64);
        metrics::gauge!(TASK_SHARDS_DONE, labels.clone()).set(t.done as f64);
        metrics::gauge!(TASK_SHARDS_FAILED, labels.clone()).set(t.failed as f64);
        metrics::gauge!(TASK_PROGRESS_RATIO, labels).set(t.ratio());
    }
    for (g, load) in &s.groups {
        let labels = vec![Label::new("queue", q.clone()), Label::new("group", g.clone())];
        metrics::gauge!(GROUP_RUNNING, labels.clone()).set(load.running as f64);
        metrics::gauge!(GROUP_WAITING, labels).set(load.waiting as f64);
    }
    let labels = vec![Label::new("queue", q)];
    metrics::gauge!(QUEUE_WAITING, labels.clone()).set(s.counts.waiting as f64);
    metrics::gauge!(QUEUE_ACTIVE, labels.clone()).set(s.counts.active as f64);
    metrics::gauge!(QUEUE_DELAYED, labels.clone()).set(s.counts.delayed as f64);
    metrics::gauge!(QUEUE_PAUSED, labels.clone()).set(if s.counts.paused { 1.0 } else { 0.0 });
    metrics::gauge!(QUEUE_RUNNING_TASKS, labels.clone()).set(s.running_tasks as f64);
    metrics::gauge!(QUEUE_FAILED_TASKS, labels.clone()).set(s.failed_tasks as f64);
    metrics::gauge!(EXECUTORS_LIVE, labels).set(s.live as f64);
}
