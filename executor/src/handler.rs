//! The handler and aggregator traits, the contexts they get, and the registry that maps a task
//! kind to its handler.

use std::future::Future;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use shardctl_common::failure::Failure;

/// A boxed, sendable future: what the traits return, so that they stay object safe.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Why an attempt failed: the reason stored with the shard, and what the failure means for the
/// shard and its task (docs/design/failure-policies.md). `ShardError::new` (and `?` on any error)
/// is a plain failure, retried after the task's backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardError {
    /// The reason stored with the shard (its last 2 KiB), shown by `status`, given to the
    /// aggregation.
    pub reason: String,
    /// What the failure means: retried, failed for good, deferred, or the task failed.
    pub failure: Failure,
}

impl ShardError {
    /// A failure with this reason, retried after the task's backoff while attempts are left.
    pub fn new(reason: impl Into<String>) -> Self {
        ShardError { reason: reason.into(), failure: Failure::Retry }
    }

    /// A failure no attempt can mend (malformed input): the shard fails for good now.
    pub fn permanent(reason: impl Into<String>) -> Self {
        ShardError { reason: reason.into(), failure: Failure::Permanent }
    }

    /// Not now (an upstream said 429): the next attempt not before `after` (at most 24 h), which
    /// uses no attempt and leaves the backoff as it was.
    pub fn retry_after(after: Duration, reason: impl Into<String>) -> Self {
        ShardError { reason: reason.into(), failure: Failure::retry_after(after) }
    }

    /// A fatal error for the whole task (a missing credential): the shard fails for good and the
    /// task fails at once, its other shards stopped.
    pub fn fail_task(reason: impl Into<String>) -> Self {
        ShardError { reason: reason.into(), failure: Failure::FailTask }
    }
}

impl std::fmt::Display for ShardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl<E: std::error::Error> From<E> for ShardError {
    fn from(e: E) -> Self {
        ShardError::new(e.to_string())
    }
}

/// What a handler learns about the shard it runs.
#[derive(Debug, Clone)]
pub struct ShardContext {
    /// The task id.
    pub task_id: String,
    /// The task kind.
    pub kind: String,
    /// This shard's index, 0-based.
    pub index: u64,
    /// Number of shards of the task.
    pub total: u64,
    /// This shard's items: `[start, end)`.
    pub range: Range<u64>,
    /// The shard key (its index, for pull tasks).
    pub key: String,
    /// The task payload, JSON text.
    pub payload: Arc<str>,
    /// 1 on the first claim of this shard, raised on every claim.
    pub attempt: u32,
    /// The executor's node id.
    pub node_id: Arc<str>,
    /// Cancelled when the shard's lock is lost or shutdown gives up waiting: stop then.
    pub cancel: CancellationToken,
}

impl ShardContext {
    /// Parses the payload.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, ShardError> {
        serde_json::from_str(&self.payload)
            .map_err(|e| ShardError::new(format!("malformed payload for kind {}: {e}", self.kind)))
    }

    /// Runs CPU-heavy `f` on the rayon pool, or inline when such work has been tiny (see
    /// [`run_cpu`]); a panic in `f` becomes a failure.
    pub async fn cpu<T, F>(&self, f: F) -> Result<T, ShardError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        run_cpu_of(&self.kind, f).await
    }
}

/// Mean time of recent CPU closures (ns, f64 bits; 0: none yet), by a hash of their kind (`""`
/// for [`run_cpu`]): kinds that share a slot share a mean, which only costs them the inline path.
static CPU_MEAN_NS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
/// CPU closures running inline on a runtime thread now.
static INLINE_NOW: AtomicUsize = AtomicUsize::new(0);
/// Below this mean, CPU work runs inline: handing it to rayon and back costs two thread
/// wake-ups, more than the work itself (see docs/design/observability.md).
const INLINE_BELOW: Duration = Duration::from_micros(100);

/// The mean's slot of `kind` (FNV-1a).
fn cpu_mean(kind: &str) -> &'static AtomicU64 {
    let h = kind.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    &CPU_MEAN_NS[(h % 64) as usize]
}

/// Runs `f` on rayon and awaits it; a panic becomes a [`ShardError`]. See [`run_cpu_of`].
pub async fn run_cpu<T, F>(f: F) -> Result<T, ShardError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_cpu_of("", f).await
}

/// Runs `f`, CPU work of task kind `kind`, on rayon and awaits it; a panic becomes a
/// [`ShardError`].
///
/// While the kind's closures have taken less than 100 µs on average, `f` runs inline on the
/// calling runtime thread instead, at most one fewer at a time than the runtime has threads: one
/// always stays free for heartbeats, so a closure far longer than its kind's mean delays nothing
/// that keeps a lock alive (its time moves the mean, and the next ones go to rayon). An inline
/// closure cannot be interrupted: a shard timeout or a cancellation takes effect when it returns.
pub async fn run_cpu_of<T, F>(kind: &str, f: F) -> Result<T, ShardError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let panicked =
        |p: Box<dyn std::any::Any + Send>| ShardError::new(format!("handler panicked: {}", panic_message(&*p)));
    let slot = cpu_mean(kind);
    let mean = f64::from_bits(slot.load(Ordering::Relaxed));
    if mean > 0.0 && mean < INLINE_BELOW.as_nanos() as f64 {
        let workers = tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers());
        if INLINE_NOW.fetch_add(1, Ordering::SeqCst) + 1 < workers {
            let started = Instant::now();
            let r = std::panic::catch_unwind(AssertUnwindSafe(f));
            INLINE_NOW.fetch_sub(1, Ordering::SeqCst);
            crate::ahead::update(slot, started.elapsed());
            return r.map_err(panicked);
        }
        INLINE_NOW.fetch_sub(1, Ordering::SeqCst);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    rayon::spawn(move || {
        let started = Instant::now();
        let r = std::panic::catch_unwind(AssertUnwindSafe(f));
        crate::ahead::update(slot, started.elapsed());
        let _ = tx.send(r.map_err(panicked));
    });
    rx.await.map_err(|_| ShardError::new("cpu work was dropped"))?
}

/// The text of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Runs the shards of one or more kinds.
pub trait Handler: Send + Sync + 'static {
    /// Runs one shard; the value is its result (JSON).
    fn run(&self, ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>>;

    /// Whether it cannot take shards for now (a worker command that keeps dying at start is
    /// paused): the executor then claims none of the kinds only it serves, which wait for
    /// another executor or the end of the pause instead of failing here.
    fn paused(&self) -> bool {
        false
    }
}

/// One shard's end, as the aggregator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardOutcome {
    /// Shard index.
    pub index: u64,
    /// Its result, or the reason it failed for good.
    pub result: Result<Value, String>,
}

/// What an aggregator gets.
#[derive(Debug, Clone)]
pub struct AggregateContext {
    /// The task id.
    pub task_id: String,
    /// The task kind.
    pub kind: String,
    /// Number of shards.
    pub total: u64,
    /// Items over all shards.
    pub items: u64,
    /// Shards completed.
    pub done: u64,
    /// Shards failed for good.
    pub failed: u64,
    /// The task payload, JSON text.
    pub payload: Arc<str>,
    /// 1 on the first claim of the aggregation job.
    pub attempt: u32,
    /// The executor's node id.
    pub node_id: Arc<str>,
    /// Every ended shard's outcome, in shard order.
    pub results: Arc<Vec<ShardOutcome>>,
    /// The shards cancelled when the task met its `--success-when` (k-of-n), in shard order:
    /// they have no outcome, and are never counted as done. Empty for any other task.
    pub cancelled: Arc<Vec<u64>>,
    /// Cancelled when the job's lock is lost.
    pub cancel: CancellationToken,
}

/// Turns the shards' results into the task's result; runs once all shards are terminal.
pub trait Aggregator: Send + Sync + 'static {
    /// Computes the task result.
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>>;
}
