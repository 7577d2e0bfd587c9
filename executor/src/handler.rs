//! The handler and aggregator traits, the contexts they get, and the registry that maps a task
//! kind to its handler.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;
use shardctl_common::kinds::Served;
use tokio_util::sync::CancellationToken;

/// A boxed, sendable future: what the traits return, so that they stay object safe.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Why an attempt failed: the reason stored with the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardError(pub String);

impl ShardError {
    /// A failure with this reason.
    pub fn new(reason: impl Into<String>) -> Self {
        ShardError(reason.into())
    }
}

impl std::fmt::Display for ShardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for ShardError {
    fn from(e: E) -> Self {
        ShardError(e.to_string())
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
            .map_err(|e| ShardError(format!("malformed payload for kind {}: {e}", self.kind)))
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
/// wake-ups, more than the work itself (see ARCHITECTURE.md, "Where an executor's time goes").
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
    let panicked = |p: Box<dyn std::any::Any + Send>| ShardError(format!("handler panicked: {}", panic_message(&*p)));
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
    /// Every shard's outcome, in shard order.
    pub results: Arc<Vec<ShardOutcome>>,
    /// Cancelled when the job's lock is lost.
    pub cancel: CancellationToken,
}

/// Turns the shards' results into the task's result; runs once all shards are terminal.
pub trait Aggregator: Send + Sync + 'static {
    /// Computes the task result.
    fn aggregate(&self, ctx: AggregateContext) -> BoxFuture<Result<Value, ShardError>>;
}

/// Which handler and aggregator serve which kind.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
    fallback: Option<(Served, Arc<dyn Handler>)>,
    served: Served,
    aggregators: HashMap<String, Arc<dyn Aggregator>>,
    fallback_aggregator: Option<Arc<dyn Aggregator>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with the built-in kinds `primes`, `noop`, `sleep` and `fail`.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        crate::builtin::register(&mut r);
        r
    }

    /// Serves `kind` with `h`.
    pub fn handler(&mut self, kind: &str, h: impl Handler) -> &mut Self {
        self.handlers.insert(kind.to_owned(), Arc::new(h));
        self.served = self.served.union(&Served::Only(vec![kind.to_owned()]));
        self
    }

    /// Aggregates tasks of `kind` with `a`.
    pub fn aggregator(&mut self, kind: &str, a: impl Aggregator) -> &mut Self {
        self.aggregators.insert(kind.to_owned(), Arc::new(a));
        self
    }

    /// Serves `kinds` (every kind, or a set) that have no handler of their own with `h`
    /// (`--exec` or `--worker` with `--kinds`); replaces an earlier fallback.
    pub fn fallback(&mut self, kinds: Served, h: impl Handler) -> &mut Self {
        let mut served = Served::Only(self.handlers.keys().cloned().collect());
        if let Served::Only(v) = &mut served {
            v.sort();
        }
        self.served = served.union(&kinds);
        self.fallback = Some((kinds, Arc::new(h)));
        self
    }

    /// Aggregates the kinds the fallback handler serves, those with no handler of their own
    /// (`--aggregate-exec` beside `--exec`). A kind registered with a handler but no aggregator
    /// (the built-in `noop`, `sleep`, `fail`) keeps the summary.
    pub fn fallback_aggregator(&mut self, a: impl Aggregator) -> &mut Self {
        self.fallback_aggregator = Some(Arc::new(a));
        self
    }

    /// The kinds this registry serves: its handlers' kinds and its fallback's. The executor
    /// claims only these (ARCHITECTURE.md "Kinds and lanes") and announces them with its
    /// membership (`dispatch` checks a kind against them).
    pub fn served(&self) -> &Served {
        &self.served
    }

    /// The kinds to claim now: [`Registry::served`], less the fallback's while it is paused
    /// ([`Handler::paused`]).
    pub fn claimable(&self) -> std::borrow::Cow<'_, Served> {
        match &self.fallback {
            Some((_, h)) if h.paused() => {
                let mut own: Vec<String> = self.handlers.keys().cloned().collect();
                own.sort();
                std::borrow::Cow::Owned(Served::Only(own))
            }
            _ => std::borrow::Cow::Borrowed(&self.served),
        }
    }

    /// Every kind it serves is a name ([`shardctl_common::names::validate_kind`]): a kind
    /// becomes part of its lane's keys, and claims list kinds joined by commas.
    pub fn check(&self) -> shardctl_common::Result<()> {
        for k in self.served.kinds().unwrap_or_default() {
            shardctl_common::names::validate_kind(k)?;
        }
        Ok(())
    }

    /// Whether `kind` has a handler of its own (not the fallback's).
    pub fn has_own(&self, kind: &str) -> bool {
        self.handlers.contains_key(kind)
    }

    /// The handler of `kind`, if any serves it.
    pub fn handler_for(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        let fallback = self.fallback.as_ref().filter(|(kinds, _)| kinds.serves(kind)).map(|(_, h)| h);
        self.handlers.get(kind).or(fallback).cloned()
    }

    /// The aggregator of `kind`: its own; for a kind without a handler of its own, the fallback;
    /// else the summary (counts only).
    pub fn aggregator_for(&self, kind: &str) -> Arc<dyn Aggregator> {
        let fallback = self.fallback_aggregator.as_ref().filter(|_| !self.handlers.contains_key(kind));
        self.aggregators.get(kind).or(fallback).cloned().unwrap_or_else(|| Arc::new(crate::builtin::Summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Switch(std::sync::atomic::AtomicBool);

    impl Handler for Arc<Switch> {
        fn run(&self, _ctx: ShardContext) -> BoxFuture<Result<Value, ShardError>> {
            Box::pin(async { Ok(Value::Null) })
        }
        fn paused(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_paused_fallback_s_kinds_are_not_claimed_until_it_resumes() {
        let switch = Arc::new(Switch(std::sync::atomic::AtomicBool::new(false)));
        let mut r = Registry::with_builtins();
        r.fallback(Served::parse("report,thumbs").unwrap(), switch.clone());
        assert_eq!(r.served().to_string(), "fail,noop,primes,report,sleep,thumbs");
        assert_eq!(r.claimable().to_string(), "fail,noop,primes,report,sleep,thumbs");
        switch.0.store(true, Ordering::SeqCst);
        assert_eq!(r.claimable().to_string(), "fail,noop,primes,sleep", "the built-in kinds go on");
        // what it serves is what it announces, paused or not
        assert_eq!(r.served().to_string(), "fail,noop,primes,report,sleep,thumbs");
        switch.0.store(false, Ordering::SeqCst);
        assert_eq!(r.claimable().to_string(), "fail,noop,primes,report,sleep,thumbs");
        r.fallback(Served::Every, switch.clone());
        assert_eq!(r.claimable().to_string(), "*");
        switch.0.store(true, Ordering::SeqCst);
        assert_eq!(r.claimable().to_string(), "fail,noop,primes,sleep");
    }

    #[test]
    fn a_kind_that_is_no_name_is_refused() {
        let mut r = Registry::with_builtins();
        assert!(r.check().is_ok());
        r.handler("a,b", crate::builtin::Noop);
        assert!(r.check().unwrap_err().to_string().contains("kind 'a,b'"));
    }
}
