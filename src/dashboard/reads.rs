//! The shared read cache: an answer computed once per request key (path and query) and second,
//! by one request at a time while the others wait for it; at most [`CONCURRENT`] computations
//! against Redis at once. So viewers cost what one does, and many keys cannot pile up reads.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};

/// How long an answer is served from the cache.
pub const FRESH: Duration = Duration::from_secs(1);
/// Reads against Redis at once.
const CONCURRENT: usize = 4;
/// Entries kept before the stale ones are dropped.
const MAX_ENTRIES: usize = 512;

/// An answer: HTTP status and JSON body.
pub type Answer = (u16, Arc<String>);

struct Entry {
    born: Instant,
    answer: OnceCell<Answer>,
}

/// The cache.
pub struct Reads {
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    gate: Semaphore,
}

impl Reads {
    pub fn new() -> Self {
        Reads { entries: Mutex::new(HashMap::new()), gate: Semaphore::new(CONCURRENT) }
    }

    /// The answer for `key`: a fresh one from the cache, else `compute`'s (shared with every
    /// request for `key` meanwhile).
    pub async fn get<F, Fut>(&self, key: &str, compute: F) -> Answer
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Answer>,
    {
        let entry = {
            let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(key) {
                Some(e) if e.born.elapsed() < FRESH => e.clone(),
                _ => {
                    if map.len() >= MAX_ENTRIES {
                        map.retain(|_, e| e.born.elapsed() < FRESH);
                    }
                    let e = Arc::new(Entry { born: Instant::now(), answer: OnceCell::new() });
                    // a burst of distinct keys past the cap is served, just not kept
                    if map.len() < MAX_ENTRIES {
                        map.insert(key.to_owned(), e.clone());
                    }
                    e
                }
            }
        };
        entry
            .answer
            .get_or_init(|| async {
                let _permit = self.gate.acquire().await;
                compute().await
            })
            .await
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn concurrent_requests_for_one_key_share_one_computation() {
        let reads = Arc::new(Reads::new());
        let runs = Arc::new(AtomicU32::new(0));
        let mut all = Vec::new();
        for _ in 0..20 {
            let (reads, runs) = (reads.clone(), runs.clone());
            all.push(tokio::spawn(async move {
                reads
                    .get("/api/queue", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        (200, Arc::new("{}".to_owned()))
                    })
                    .await
            }));
        }
        for h in all {
            assert_eq!(h.await.unwrap().0, 200);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // another key is its own
        let other = reads.get("/api/tasks", || async { (404, Arc::new("x".to_owned())) }).await;
        assert_eq!(other.0, 404);
    }
}
