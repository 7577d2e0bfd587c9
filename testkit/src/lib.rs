//! Test support: [`TestRedis`] starts a private `redis-server` on a free port, waits until it
//! answers, and kills it on drop. Tests never touch a shared Redis on 6379.
//!
//! # Layout
//! - [`server`]: [`TestRedis`], its restart (for outage tests).
//! - [`machine`]: [`free_port`], [`free_addr`], fresh directories, [`tool_available`].
//! - [`cluster`]: [`TestCluster`], a real 3-master Redis Cluster, and slot checks.
//! - [`process`]: [`Process`], the one guard around a process a test starts; [`signal`],
//!   [`eventually`].
//! - [`browser`]: [`Browser`](browser::Browser), headless Chromium driven over WebDriver
//!   (chromedriver), for the dashboard's tests.
//! - [`secure`]: [`SecureRedis`], a server behind a password, ACL users and optionally TLS (with
//!   a throwaway CA made by `openssl`).

pub mod browser;
pub mod cluster;
pub mod machine;
pub mod process;
pub mod secure;
pub mod server;

pub use cluster::TestCluster;
pub use machine::{free_addr, free_port, tool_available};
pub use process::{eventually, eventually_async, signal, Process};
pub use secure::SecureRedis;
pub use server::TestRedis;
