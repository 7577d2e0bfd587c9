//! [`TestRedis`]: a private redis-server on a free port, its restart (for outage tests).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::machine::{free_port, print_log_tail, temp_dir};

/// A private redis-server, killed on drop.
pub struct TestRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    persistent: bool,
}

impl TestRedis {
    /// Starts a server that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a server with an append-only file, so that [`TestRedis::restart`] keeps its data.
    pub fn start_persistent() -> Self {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Self {
        let dir = temp_dir("redis");
        // a port picked free can be taken before redis binds it: try a few
        for _ in 0..5 {
            let mut r = TestRedis { child: None, port: free_port(), dir: dir.clone(), persistent };
            if r.spawn() {
                return r;
            }
        }
        panic!(
            "redis-server did not start; log:\n{}",
            std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
        );
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--dir", self.dir.to_str().unwrap(), "--logfile", "redis.log"])
            .args(["--protected-mode", "no"]);
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let child =
            cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}); install it: apt-get install -y redis-server")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(c) = redis::Client::open(self.url()) {
                if let Ok(mut con) = c.get_connection_with_timeout(Duration::from_millis(200)) {
                    if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                        return true;
                    }
                }
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A blocking connection, for test set-up and checks.
    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// The server's log, for panic messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Stops the server (SIGKILL): clients see the connection drop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // with appendfsync always the AOF already holds every write
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart; log:\n{}", self.log());
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail(self.port, &self.log());
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
