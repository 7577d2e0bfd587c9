//! The shared read cache: an answer computed once per request key (path and query) and second,
//! by one request at a time while the others wait for it, however long it takes; at most
//! [`CONCURRENT`] computations against Redis at once, and a request that cannot start one within
//! [`QUEUE_WAIT`] is answered 503. So viewers cost what one does, and many keys cannot pile up
//! reads.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use tokio::sync::{OnceCell, Semaphore};

/// How long an answer is served from the cache, from the moment it was computed.
pub const FRESH: Duration = Duration::from_secs(1);
/// Reads against Redis at once.
const CONCURRENT: usize = 4;
/// How long a request waits for a free read before it is answered 503.
const QUEUE_WAIT: Duration = Duration::from_secs(5);
/// Entries kept before the stale ones are dropped.
const MAX_ENTRIES: usize = 512;

/// An answer: HTTP status and JSON body.
pub type Answer = (u16, Bytes);

struct Entry {
    /// The answer and when it was computed.
    answer: OnceCell<(Instant, Answer)>,
}

impl Entry {
    /// Whether a request may take this entry's answer: being computed, or computed within
    /// [`FRESH`].
    fn usable(&self) -> bool {
        self.answer.get().is_none_or(|(at, _)| at.elapsed() < FRESH)
    }
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

    /// The answer for `key`: a fresh or coming one from the cache, else `compute`'s (shared with
    /// every request for `key` meanwhile).
    pub async fn get<F, Fut>(&self, key: &str, compute: F) -> Answer
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Answer>,
    {
        let entry = {
            let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(key) {
                Some(e) if e.usable() => e.clone(),
                _ => {
                    if map.len() >= MAX_ENTRIES {
                        map.retain(|_, e| e.answer.get().is_none_or(|(at, _)| at.elapsed() < FRESH));
                    }
                    let e = Arc::new(Entry { answer: OnceCell::new() });
                    // a burst of distinct keys past the cap is served, just not kept
                    if map.len() < MAX_ENTRIES {
                        map.insert(key.to_owned(), e.clone());
                    }
                    e
                }
            }
        };
        let (_, answer) = entry
            .answer
            .get_or_init(|| async {
                let answer = match tokio::time::timeout(QUEUE_WAIT, self.gate.acquire()).await {
                    Ok(_permit) => compute().await,
                    Err(_) => {
                        (503, Bytes::from_static(br#"{"error":"the dashboard is busy reading redis: try again"}"#))
                    }
                };
                (Instant::now(), answer)
            })
            .await;
        answer.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn concurrent_requests_for_one_key_share_one_computation_however_long() {
        let reads = Arc::new(Reads::new());
        let runs = Arc::new(AtomicU32::new(0));
        let mut all = Vec::new();
        for n in 0..20u64 {
            let (reads, runs) = (reads.clone(), runs.clone());
            all.push(tokio::spawn(async move {
                // arrivals spread over 1.5 s, longer than FRESH: all join the one computation
                tokio::time::sleep(Duration::from_millis(n * 75)).await;
                reads
                    .get("/api/queue", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2000)).await;
                        (200, Bytes::from_static(b"{}"))
                    })
                    .await
            }));
        }
        for h in all {
            assert_eq!(h.await.unwrap().0, 200);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // another key is its own
        let other = reads.get("/api/tasks", || async { (404, Bytes::from_static(b"x")) }).await;
        assert_eq!(other.0, 404);
    }
}
