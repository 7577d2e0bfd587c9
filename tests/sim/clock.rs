//! The one place the simulator reads time: the Redis server's clock, the one the scripts store
//! and compare (docs/design/clock.md). Retries come due in real time (delays of 0 to 5 ms);
//! nothing is made due by a fake clock.

use shardctl_common::conn::Conn;
use shardctl_common::time::server_now_ms;
use shardctl_common::Home;

/// Sleeps until the server's clock has passed `due_ms` (a retry's due time as a script wrote it,
/// at most a few ms away).
pub async fn wait_past(con: &mut Conn, home: &Home, due_ms: u64) -> Result<(), String> {
    loop {
        let now = server_now_ms(con, home).await.map_err(|e| format!("TIME: {e}"))?;
        if now > due_ms {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}
