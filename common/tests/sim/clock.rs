//! The one place the simulator reads time: the `now_ms` that the script wrappers take. Retries
//! come due in real time (delays of 0 to 5 ms); nothing is made due by a fake clock. When the
//! scripts read Redis `TIME` themselves, the wrappers lose the argument and this goes.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch, as an executor or operator would pass them.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as u64
}

/// Sleeps until `now_ms()` has passed `due_ms` (a retry's due time, at most a few ms away).
pub async fn wait_past(due_ms: u64) {
    while now_ms() <= due_ms {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}
