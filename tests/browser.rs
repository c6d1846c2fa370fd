//! The relay in a real browser: Debian's `chromium`, headless, driven over
//! the Chrome DevTools Protocol (a WebSocket, with the test's own
//! tokio-tungstenite) against the real binary. It reads the landing page's
//! DOM (the relay's name, its NIPs), watches the status page's counters and
//! chart change while the test publishes over a real WebSocket, checks that
//! no Content-Security-Policy violation was reported (a
//! `securitypolicyviolation` listener installed before any page script,
//! and the DevTools log), and takes a screenshot of each page (landing.png,
//! status.png): to the test's target directory, or to `docs/img/` (which
//! README.md shows) with `UPDATE_SCREENSHOTS=1`, so a test run leaves the
//! committed ones alone.
//!
//! Without a browser the test says so and passes, unless
//! `BROWSER_TESTS_REQUIRE=1` (set by `.ci/run`).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Relay, ev, now, pubkey_hex};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The longest any one awaited state may take.
const DEADLINE: Duration = Duration::from_secs(120);

/// Installed before any script of each page: collects CSP violations.
const CSP_LISTENER: &str = "window.__csp = []; document.addEventListener('securitypolicyviolation', \
     (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));";

fn find_browser() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

/// A headless browser and one page of it, over CDP.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Console errors, exceptions and log entries the page reported.
    problems: Vec<String>,
}

impl Browser {
    async fn launch(bin: &std::path::Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(i) = line.find("ws://") {
                    let _ = tx.try_send(line[i..].trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(DEADLINE)
            .expect("chromium printed no DevTools URL");
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to DevTools");
        let mut b = Browser {
            child,
            _profile: profile,
            ws,
            session: String::new(),
            next_id: 0,
            problems: Vec::new(),
        };
        let target = b
            .call(false, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = b
            .call(
                false,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(true, domain, json!({})).await;
        }
        b.call(
            true,
            "Page.addScriptToEvaluateOnNewDocument",
            json!({"source": CSP_LISTENER}),
        )
        .await;
        b.viewport(1100, 900).await;
        b
    }

    /// One CDP command (to the page's session or the browser); its result.
    async fn call(&mut self, to_page: bool, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if to_page {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .unwrap();
        loop {
            let frame = tokio::time::timeout(DEADLINE, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method}"))
                .expect("DevTools closed")
                .unwrap();
            let Message::Text(text) = frame else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == json!(id) {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
            self.note(&v);
        }
    }

    /// Keeps what the page reports that a clean page would not.
    fn note(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Log.entryAdded") => {
                let e = &p["entry"];
                if e["level"] == "error" || e["source"] == "security" {
                    self.problems.push(format!("log: {e}"));
                }
            }
            Some("Runtime.exceptionThrown") => self.problems.push(format!("exception: {p}")),
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.problems.push(format!("console: {p}"))
            }
            _ => {}
        }
    }

    async fn viewport(&mut self, width: u64, height: u64) {
        self.call(
            true,
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
    }

    /// The value of a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                true,
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(r["exceptionDetails"].is_null(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Opens `url` and waits until it has loaded.
    async fn open(&mut self, url: &str) {
        let r = self.call(true, "Page.navigate", json!({"url": url})).await;
        assert!(r["errorText"].is_null(), "{url}: {r}");
        self.wait_for("document.readyState === 'complete'", url)
            .await;
    }

    /// Waits until `expression` is true in the page.
    async fn wait_for(&mut self, expression: &str, what: &str) {
        let deadline = Instant::now() + DEADLINE;
        while self.eval(expression).await != json!(true) {
            assert!(Instant::now() < deadline, "never true: {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The CSP violations and other problems reported so far.
    async fn violations(&mut self) -> Vec<String> {
        let mut out: Vec<String> = self
            .eval("JSON.stringify(window.__csp || ['listener missing'])")
            .await
            .as_str()
            .map(|s| serde_json::from_str(s).unwrap())
            .unwrap_or_default();
        out.append(&mut self.problems);
        out
    }

    /// A PNG of the whole page, written to `name` in docs/img with
    /// `UPDATE_SCREENSHOTS=1`, else beside the test binary.
    async fn screenshot(&mut self, name: &str) {
        let height = self
            .eval("Math.ceil(document.documentElement.scrollHeight)")
            .await
            .as_u64()
            .unwrap();
        self.viewport(1100, height.clamp(600, 4000)).await;
        let shot = self
            .call(true, "Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = if std::env::var_os("UPDATE_SCREENSHOTS").is_some() {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/img")
        } else {
            std::env::current_exe()
                .unwrap()
                .parent()
                .unwrap()
                .join("screenshots")
        };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
        self.viewport(1100, 900).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_pages_render_update_and_keep_their_policy_in_chromium() {
    let Some(bin) = find_browser() else {
        assert!(
            std::env::var("BROWSER_TESTS_REQUIRE").as_deref() != Ok("1"),
            "BROWSER_TESTS_REQUIRE=1 but no chromium on PATH (apt-get install chromium)"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium chromium-driver)");
        return;
    };
    let relay = Relay::start_with(&[
        ("SLUICE_RELAY__NAME", "Sluice test relay"),
        (
            "SLUICE_RELAY__DESCRIPTION",
            "A relay started by tests/browser.rs.",
        ),
        ("SLUICE_RELAY__PUBKEY", &pubkey_hex(1)),
        ("SLUICE_RELAY__CONTACT", "mailto:operator@relay.example"),
    ]);
    let mut browser = Browser::launch(&bin).await;

    // The landing page: its name and NIPs in the DOM, its script ran (the
    // copy buttons show), nothing refused by the policy.
    browser.open(&relay.http("/")).await;
    let name = browser
        .eval("document.getElementById('relay-name').textContent")
        .await;
    assert_eq!(name, "Sluice test relay");
    let nips = browser
        .eval("Array.from(document.querySelectorAll('#nips a')).map((a) => a.textContent + ' ' + a.href)")
        .await;
    let nips: Vec<&str> = nips
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for n in ["01", "11", "42", "77"] {
        let want = format!("NIP-{n} https://github.com/nostr-protocol/nips/blob/master/{n}.md");
        assert!(nips.contains(&want.as_str()), "{want} not in {nips:?}");
    }
    browser
        .wait_for(
            "Array.from(document.querySelectorAll('button.copy')).every((b) => !b.hidden)",
            "the copy buttons shown by /assets/page.js",
        )
        .await;
    let npub = browser
        .eval("document.getElementById('npub').textContent")
        .await;
    assert!(npub.as_str().unwrap().starts_with("npub1"), "{npub}");
    let styled = browser
        .eval("getComputedStyle(document.querySelector('.card')).borderRadius")
        .await;
    assert_eq!(styled, "10px", "the stylesheet from 'self' applies");
    browser.screenshot("landing.png").await;
    let v = browser.violations().await;
    assert!(v.is_empty(), "the landing page reported: {v:?}");

    // The status page, while a client publishes (at a varying pace), one
    // receives and one queries: its counters and chart follow.
    let mut reader = relay.client().await;
    reader.req("live", &[json!({"kinds": [1]})]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let publishing = tokio::spawn({
        let stop = stop.clone();
        let mut writer = relay.client().await;
        async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                writer
                    .publish(&ev(2, now(), 1, &[], &format!("note {i}")))
                    .await;
                tokio::time::sleep(Duration::from_millis(40 + (i % 20) * 5)).await;
            }
        }
    });
    let querying = tokio::spawn({
        let stop = stop.clone();
        let mut querier = relay.client().await;
        async move {
            while !stop.load(Ordering::Relaxed) {
                querier.req("q", &[json!({"kinds": [1], "limit": 5})]).await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    let draining =
        tokio::spawn(
            async move { while reader.try_recv(Duration::from_secs(120)).await.is_some() {} },
        );
    browser.open(&relay.http("/status")).await;
    browser
        .wait_for(
            "(() => { const t = document.getElementById('traffic'); \
              const high = (cls) => t.querySelector('polyline.' + cls).getAttribute('points') \
                .split(' ').some((p) => parseFloat(p.split(',')[1]) < 150); \
              return Number(t.dataset.updates) >= 2 && Number(t.dataset.samples) >= 30 \
                && high('in') && high('out') && high('queries') \
                && parseFloat(document.getElementById('events-in').textContent) > 0 \
                && parseFloat(document.getElementById('events-out').textContent) > 0 \
                && parseFloat(document.getElementById('queries').textContent) > 0 \
                && document.getElementById('connections').textContent === '3'; })()",
            "the status page's counters and chart show the traffic",
        )
        .await;
    let live = browser
        .eval("document.getElementById('live').textContent")
        .await;
    assert!(live.as_str().unwrap().starts_with("Live"), "{live}");
    browser.screenshot("status.png").await;
    stop.store(true, Ordering::Relaxed);
    publishing.await.unwrap();
    querying.await.unwrap();
    draining.abort();
    let v = browser.violations().await;
    assert!(v.is_empty(), "the status page reported: {v:?}");
}
