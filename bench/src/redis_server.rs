//! A private redis-server for `shardctl bench` and `shardctl demo`: a free port, nothing on
//! disk, killed on drop; [`RedisServer::start_with`] adds flags (the `durability` scenario's
//! replica: `--replicaof`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A redis-server child process, killed (and its directory removed) on drop.
pub struct RedisServer {
    child: Child,
    /// Its URL.
    pub url: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: std::path::PathBuf,
}

impl RedisServer {
    /// The URL given with `--redis`, or a private server started now (kept alive by the guard
    /// returned beside the URL).
    pub fn unless_given(given: &Option<String>) -> anyhow::Result<(Option<RedisServer>, String)> {
        if let Some(u) = given {
            return Ok((None, u.clone()));
        }
        let server = RedisServer::start()?;
        eprintln!("started a private redis-server at {}", server.url);
        let url = server.url.clone();
        Ok((Some(server), url))
    }

    /// Starts one on a free loopback port, and waits until it answers (at most 10 s).
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with `extra` flags after the defaults (a directory of its own
    /// each, so that several can run at once).
    pub fn start_with(extra: &[&str]) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("shardctl-demo-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", dir.to_str().context("temp dir path")?])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start redis-server: install it (apt-get install -y redis-server) or pass --redis URL")?;
        let mut s = RedisServer { child, url: format!("redis://127.0.0.1:{port}"), port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut con) =
                redis::Client::open(s.url.as_str())?.get_connection_with_timeout(Duration::from_millis(200))
            {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return Ok(s);
                }
            }
            if let Some(status) = s.child.try_wait()? {
                bail!("redis-server exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("redis-server did not answer within 10s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
