//! Which handler and aggregator serve which kind: the [`Registry`] an executor claims and runs
//! by (docs/design/lanes.md), with the built-in kinds of [`crate::builtin`].

use std::collections::HashMap;
use std::sync::Arc;

use shardctl_common::kinds::Served;

use crate::builtin;
use crate::handler::{Aggregator, Handler};

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
        r.handler("primes", builtin::Primes).aggregator("primes", builtin::PrimesTotal);
        r.handler("noop", builtin::Noop).handler("sleep", builtin::Sleep).handler("fail", builtin::Fail);
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
    /// claims only these (docs/design/lanes.md) and announces them with its
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
        self.aggregators.get(kind).or(fallback).cloned().unwrap_or_else(|| Arc::new(builtin::Summary))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use serde_json::Value;

    use super::*;
    use crate::handler::{BoxFuture, ShardContext, ShardError};

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
        r.handler("a,b", builtin::Noop);
        assert!(r.check().unwrap_err().to_string().contains("kind 'a,b'"));
    }
}
