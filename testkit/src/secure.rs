//! [`SecureRedis`]: a private redis-server the way production runs one: the default user behind
//! a password, ACL users of the test's choosing, and optionally TLS only (no plain port) with a
//! server certificate signed by a throwaway CA that `openssl` makes at start. Killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::machine::{free_port, temp_dir};

/// A redis-server behind a password and ACL users, optionally TLS only; killed on drop.
pub struct SecureRedis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    tls: bool,
    admin_password: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}); install it: apt-get install -y openssl"));
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`ca.crt`) and a server certificate for 127.0.0.1 and localhost signed by it
/// (`server.crt`, `server.key`), valid one day. X.509 v3 with the CA flag: rustls insists.
fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend_from_slice(&ec);
    ca.extend_from_slice(&["-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=shardctl test CA"]);
    ca.extend_from_slice(&["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend_from_slice(&ec);
    csr.extend_from_slice(&["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    openssl(dir, &csr);
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
        .expect("write server.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
    );
}

impl SecureRedis {
    /// Starts a server whose default user needs `admin_password`, with one ACL user per line of
    /// `users` (each `name on >password … rules`, as in `ACL SETUSER`), TLS only when `tls`.
    pub fn start(admin_password: &str, users: &[&str], tls: bool) -> Self {
        let dir = temp_dir("secure");
        if tls {
            make_certificates(&dir);
        }
        for _ in 0..5 {
            let port = free_port();
            let mut conf = vec![
                "bind 127.0.0.1".to_owned(),
                "save \"\"".to_owned(),
                "appendonly no".to_owned(),
                format!("dir {}", dir.display()),
                "logfile redis.log".to_owned(),
                format!("requirepass {admin_password}"),
            ];
            if tls {
                conf.push("port 0".to_owned());
                conf.push(format!("tls-port {port}"));
                conf.push("tls-cert-file server.crt".to_owned());
                conf.push("tls-key-file server.key".to_owned());
                conf.push("tls-ca-cert-file ca.crt".to_owned());
                conf.push("tls-auth-clients no".to_owned());
            } else {
                conf.push(format!("port {port}"));
            }
            conf.extend(users.iter().map(|u| format!("user {u}")));
            std::fs::write(dir.join("redis.conf"), conf.join("\n") + "\n").expect("write redis.conf");
            let _ = std::fs::remove_file(dir.join("redis.log"));
            let child = Command::new("redis-server")
                .current_dir(&dir)
                .arg(dir.join("redis.conf"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start redis-server ({e})"));
            let mut r =
                SecureRedis { child: Some(child), port, dir: dir.clone(), tls, admin_password: admin_password.into() };
            if r.wait_ready() {
                return r;
            }
            r.stop();
        }
        panic!(
            "secured redis-server did not start; log:\n{}",
            std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
        );
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.log().contains("Ready to accept connections") {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The URL for `user` with `password` (`None`: the default user): `rediss://` under TLS.
    pub fn url(&self, user: Option<&str>, password: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}:{password}@127.0.0.1:{}", user.unwrap_or(""), self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate that signed the server's (TLS only): what `SSL_CERT_FILE` points at.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A blocking connection as the default user, for set-up and checks.
    pub fn admin(&self) -> redis::Connection {
        let url = self.url(None, &self.admin_password);
        let client = if self.tls {
            let ca = std::fs::read(self.ca_file()).expect("read ca.crt");
            redis::Client::build_with_tls(url, redis::TlsCertificates { client_tls: None, root_cert: Some(ca) })
        } else {
            redis::Client::open(url)
        };
        client.expect("client").get_connection_with_timeout(Duration::from_secs(5)).expect("admin connection")
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for SecureRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            crate::machine::print_log_tail(self.port, &self.log());
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
