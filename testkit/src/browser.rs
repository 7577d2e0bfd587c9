//! A headless Chromium driven over WebDriver: a private `chromedriver` on a free port (killed on
//! drop) and a [`fantoccini`] session against it. Chromium and chromedriver are the Debian
//! packages `chromium` and `chromium-driver`; without them [`Browser::start`] returns `None`
//! outside CI and fails the test under `CI=true` ([`crate::machine::tool_available`]).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use fantoccini::{Client, Locator};

use crate::process::Process;

/// A browser session and the chromedriver behind it.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    _driver: Process,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (a 1280×1000 window).
    pub async fn start() -> Option<Browser> {
        if !crate::machine::tool_available(
            "chromedriver",
            &["--version"],
            "the dashboard's browser tests (Debian: chromium-driver)",
        ) {
            return None;
        }
        let port = crate::machine::free_port();
        let mut cmd = Command::new("chromedriver");
        cmd.arg(format!("--port={port}")).stdout(Stdio::null());
        let driver = Process::spawn(cmd, "chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", "--hide-scrollbars"],
            },
        }))
        .expect("capabilities");
        // chromedriver takes a moment to listen
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match fantoccini::ClientBuilder::new(connector).capabilities(caps.clone()).connect(&url).await {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot open a Chromium session through chromedriver: {e}\n{}", driver.log()),
            }
        };
        Some(Browser { client, _driver: driver })
    }

    /// Runs `script` in the page (a function body; `arguments` are none) and returns its value.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, Vec::new()).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns a truthy value (a guard against a hang, not a time
    /// assertion); panics with the last value and `what`.
    pub async fn until(&self, what: &str, patience: Duration, script: &str) -> serde_json::Value {
        let deadline = Instant::now() + patience;
        loop {
            let v = self.eval(script).await;
            let truthy = !matches!(&v, serde_json::Value::Null | serde_json::Value::Bool(false))
                && v != serde_json::json!(0)
                && v != serde_json::json!("");
            if truthy {
                return v;
            }
            assert!(Instant::now() < deadline, "waited for {what}: not so after {patience:?}; last: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
