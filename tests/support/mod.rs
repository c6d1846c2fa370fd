//! Test support: start the real `sluice` binary on port 0 with a temporary
//! store, learn its address from the `listening on ws://` log line, and
//! talk to it over a real WebSocket.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sluice_proto::Event;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any single expected answer may take before the test fails.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// `sluice` with a clean environment, on the store at `store`: a 512 MB map
/// and a free-disk floor of 64 MB, which a nearly full CI disk still clears
/// (the default is 1 GiB, and a run once failed on 1,009 MB free). The disk
/// tests set their own floor.
pub fn sluice_on(store: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("SLUICE_STORE__PATH", store)
        .env("SLUICE_STORE__MAP_SIZE_MB", "512")
        .env("SLUICE_STORE__MIN_FREE_DISK_MB", "64");
    cmd
}

/// A running relay process; killed on drop.
pub struct Relay {
    child: Option<Child>,
    pub addr: String,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Relay {
    pub fn start() -> Relay {
        Relay::start_with(&[])
    }

    /// Starts with extra `SLUICE_...` environment variables.
    pub fn start_with(env: &[(&str, &str)]) -> Relay {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut r = Relay::start_in(&dir, env);
        r._tmp = Some(tmp);
        r
    }

    /// Starts with `--config FILE` and a temporary store.
    pub fn start_with_config(file: &Path, env: &[(&str, &str)]) -> Relay {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let mut r = Relay::spawn(&dir, Some(file), env);
        r._tmp = Some(tmp);
        r
    }

    /// Starts with a config file holding `toml` (kept beside the store).
    pub fn start_with_toml(toml: &str, env: &[(&str, &str)]) -> Relay {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("sluice.toml");
        std::fs::write(&file, toml).unwrap();
        let mut r = Relay::spawn(&tmp.path().join("store"), Some(&file), env);
        r._tmp = Some(tmp);
        r
    }

    /// Starts on an existing store directory with a config file holding
    /// `toml` (written beside the store, as `<store>.toml`).
    pub fn start_in_with_toml(dir: &Path, toml: &str, env: &[(&str, &str)]) -> Relay {
        let file = dir.with_extension("toml");
        std::fs::write(&file, toml).unwrap();
        Relay::spawn(dir, Some(&file), env)
    }

    /// Starts on an existing store directory (for restart tests).
    pub fn start_in(dir: &Path, env: &[(&str, &str)]) -> Relay {
        Relay::spawn(dir, None, env)
    }

    /// Starts with a temporary store under an open-files limit of
    /// `nofile` (`prlimit --nofile`).
    pub fn start_with_nofile(nofile: u64, env: &[(&str, &str)]) -> Relay {
        let tmp = tempfile::tempdir().unwrap();
        let mut r = Relay::spawn_limited(&tmp.path().join("store"), None, env, Some(nofile));
        r._tmp = Some(tmp);
        r
    }

    fn spawn(dir: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Relay {
        Relay::spawn_limited(dir, config, env, None)
    }

    fn spawn_limited(
        dir: &Path,
        config: Option<&Path>,
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Relay {
        // prlimit sets the limit and executes the relay in its place.
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}")).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg("serve");
        if let Some(f) = config {
            cmd.arg("--config").arg(f);
        }
        // The same environment as `sluice_on` (prlimit may run first).
        cmd.env_clear()
            .env("SLUICE_SERVER__LISTEN", "127.0.0.1:0")
            .env("SLUICE_STORE__PATH", dir)
            .env("SLUICE_STORE__MAP_SIZE_MB", "512")
            .env("SLUICE_STORE__MIN_FREE_DISK_MB", "64")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sluice");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::sync_channel(1);
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(i) = line.find("listening on ws://") {
                    let addr = line[i + "listening on ws://".len()..].trim().to_string();
                    let _ = tx.send(addr);
                }
                log2.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(ANSWER_TIMEOUT) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "relay did not report its address; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Relay {
            child: Some(child),
            addr,
            dir: dir.to_path_buf(),
            _tmp: None,
            log,
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.url()).await
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("relay running");
        signal(&child, "TERM");
        wait_exit(&mut child)
    }

    /// Waits for the process to exit (after a signal sent earlier).
    pub fn wait_stopped(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("relay running");
        wait_exit(&mut child)
    }

    /// Takes the temporary directory holding the store, so it outlives
    /// this process (a restart on the same store).
    pub fn keep_dir(&mut self) -> Option<tempfile::TempDir> {
        self._tmp.take()
    }

    /// The relay's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("relay running").id()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Relay {
    /// Sends a signal to the running relay.
    pub fn signal(&self, sig: &str) {
        signal(self.child.as_ref().expect("relay running"), sig);
    }

    /// GET a path and parse JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let (status, _, body) = http_get(&self.addr, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The value of one series in /metrics: the sum over the series of
    /// `name` whose labels include every `label="value"` given. Fails the
    /// test when /metrics does not answer 200 or no such series exists (a
    /// renamed metric or label must not read as 0): where "never counted"
    /// is the expected answer, use [`Relay::metric_or_zero`].
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let body = self.metrics_text().await;
        match series_sum(&body, name, labels) {
            Some(v) => v,
            None => panic!(
                "no series {name}{{{}}} on /metrics; series of that name: {:?}",
                labels.join(","),
                body.lines()
                    .filter(|l| l.split(['{', ' ']).next() == Some(name))
                    .collect::<Vec<_>>()
            ),
        }
    }

    /// [`Relay::metric`], or 0 when no such series exists yet (a counter
    /// never incremented, a gauge never set). The name must be one the
    /// relay documents (docs/metrics.md), so a renamed metric still fails.
    pub async fn metric_or_zero(&self, name: &str, labels: &[&str]) -> f64 {
        assert!(
            documented_metric(name),
            "{name} is not a metric docs/metrics.md documents"
        );
        series_sum(&self.metrics_text().await, name, labels).unwrap_or(0.0)
    }

    async fn metrics_text(&self) -> String {
        let (status, _, body) = http_get(&self.addr, "/metrics", None).await;
        assert_eq!(status, 200, "/metrics: {body}");
        body
    }
}

/// The sum over the series of `name` having every `label="value"` given;
/// `None` when there is none.
pub fn series_sum(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (head, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let (series, set) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        if series != name {
            continue;
        }
        let pairs: Vec<&str> = set.split("\",").map(|p| p.trim_end_matches('"')).collect();
        let has = |want: &str| pairs.iter().any(|p| *p == want.trim_end_matches('"'));
        if labels.iter().all(|l| has(l))
            && let Ok(v) = value.parse::<f64>()
        {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Whether docs/metrics.md documents a metric of this name.
fn documented_metric(name: &str) -> bool {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap_or_default();
    let family = ["_sum", "_count", "_bucket"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    doc.contains(&format!("`{name}`")) || doc.contains(&format!("`{family}`"))
}

pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} failed");
}

pub fn wait_exit(child: &mut Child) -> ExitStatus {
    for _ in 0..400 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("relay did not exit within 20 s");
}

/// A WebSocket client speaking NIP-01. NIP-42 `AUTH` challenges are kept
/// aside (see [`Client::challenge`]), never returned by `recv`.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    challenge: Option<String>,
}

impl Client {
    pub async fn connect(url: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        Client {
            ws,
            challenge: None,
        }
    }

    /// Connects from a chosen loopback source address (127.0.0.2, ...), so
    /// tests can play several clients.
    pub async fn connect_from(url: &str, source: &str) -> Client {
        Client::try_connect_with(url, Some(source), &[])
            .await
            .expect("connect")
    }

    /// Connects with optional source address and extra request headers;
    /// `Err` carries the HTTP status when the upgrade is refused.
    pub async fn try_connect_with(
        url: &str,
        source: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Client, u16> {
        Client::try_connect_socket(url, source, None, headers).await
    }

    /// Connects from `source` with a receive buffer of `rcvbuf` bytes: once
    /// it stops reading, the relay's sends to it stall after a few KiB
    /// rather than after the kernel's autotuned megabytes.
    pub async fn connect_small_buffer(url: &str, source: &str, rcvbuf: u32) -> Client {
        Client::try_connect_socket(url, Some(source), Some(rcvbuf), &[])
            .await
            .expect("connect")
    }

    async fn try_connect_socket(
        url: &str,
        source: Option<&str>,
        rcvbuf: Option<u32>,
        headers: &[(&str, &str)],
    ) -> Result<Client, u16> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let addr: std::net::SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(size) = rcvbuf {
            socket.set_recv_buffer_size(size).unwrap();
        }
        if let Some(src) = source {
            socket.bind(format!("{src}:0").parse().unwrap()).unwrap();
        }
        let stream = socket.connect(addr).await.expect("tcp connect");
        let mut req = url.into_client_request().unwrap();
        for (k, v) in headers {
            req.headers_mut().insert(
                tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        match tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream)).await {
            Ok((ws, _)) => Ok(Client {
                ws,
                challenge: None,
            }),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
            Err(e) => panic!("websocket handshake failed: {e}"),
        }
    }

    /// The WebSocket handshake over an already connected `stream`; `Err`
    /// when the relay refuses or closes it.
    pub async fn over(
        url: &str,
        stream: TcpStream,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let (ws, _) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream)).await?;
        Ok(Client {
            ws,
            challenge: None,
        })
    }

    /// Sends without waiting for anything.
    pub async fn send_event(&mut self, ev: &Event) {
        self.send_text(&format!("[\"EVENT\",{}]", ev.raw())).await;
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws
            .send(Message::Text(text.into()))
            .await
            .expect("send");
    }

    /// Sends; false once the connection is gone.
    pub async fn send_text_checked(&mut self, text: &str) -> bool {
        self.ws.send(Message::Text(text.into())).await.is_ok()
    }

    pub async fn send(&mut self, v: Value) {
        self.send_text(&v.to_string()).await;
    }

    /// Next text message as JSON; panics after [`ANSWER_TIMEOUT`].
    pub async fn recv(&mut self) -> Value {
        self.try_recv(ANSWER_TIMEOUT)
            .await
            .expect("no message from relay in time")
    }

    /// Next text message, or `None` if none comes within `wait` (or the
    /// connection closed).
    pub async fn try_recv(&mut self, wait: Duration) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(wait, self.ws.next()).await.ok()??;
            match msg {
                Ok(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(&t).expect("relay sent JSON");
                    if self.keep_challenge(&v) {
                        continue;
                    }
                    return Some(v);
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Keeps an `["AUTH", challenge]` aside; true if `v` was one.
    fn keep_challenge(&mut self, v: &Value) -> bool {
        if v[0] == "AUTH" && v.as_array().is_some_and(|a| a.len() == 2) {
            self.challenge = Some(v[1].as_str().expect("challenge is a string").into());
            return true;
        }
        false
    }

    /// The NIP-42 challenge this connection was sent, waiting for it if it
    /// has not come yet (call when no other answer is pending: messages
    /// read meanwhile are dropped).
    pub async fn challenge(&mut self) -> String {
        while self.challenge.is_none() {
            let msg = tokio::time::timeout(ANSWER_TIMEOUT, self.ws.next())
                .await
                .expect("no AUTH challenge in time")
                .expect("connection closed")
                .expect("ws error");
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).expect("relay sent JSON");
                assert!(self.keep_challenge(&v), "expected AUTH, got {v}");
            }
        }
        self.challenge.clone().unwrap()
    }

    /// Whether a challenge has been received so far.
    pub fn has_challenge(&self) -> bool {
        self.challenge.is_some()
    }

    /// Raw text of the next message (to check byte-identical events).
    pub async fn recv_text(&mut self) -> String {
        loop {
            let msg = tokio::time::timeout(ANSWER_TIMEOUT, self.ws.next())
                .await
                .expect("no message in time")
                .expect("connection closed")
                .expect("ws error");
            if let Message::Text(t) = msg {
                if serde_json::from_str::<Value>(&t).is_ok_and(|v| self.keep_challenge(&v)) {
                    continue;
                }
                return t.to_string();
            }
        }
    }

    /// Publishes and returns the OK's (accepted, message).
    pub async fn publish(&mut self, ev: &Event) -> (bool, String) {
        self.send_text(&format!("[\"EVENT\",{}]", ev.raw())).await;
        self.expect_ok(&ev.id_hex()).await
    }

    pub async fn expect_ok(&mut self, id: &str) -> (bool, String) {
        loop {
            let m = self.recv().await;
            if m[0] == "OK" && m[1] == id {
                return (m[2].as_bool().unwrap(), m[3].as_str().unwrap().to_string());
            }
        }
    }

    /// Sends a REQ and collects the stored events (raw JSON text of each
    /// event object) until EOSE. Panics on CLOSED.
    pub async fn req(&mut self, sub: &str, filters: &[Value]) -> Vec<String> {
        let mut msg = vec![json!("REQ"), json!(sub)];
        msg.extend(filters.iter().cloned());
        self.send(Value::Array(msg)).await;
        self.collect_until_eose(sub).await
    }

    pub async fn collect_until_eose(&mut self, sub: &str) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let text = self.recv_text().await;
            let v: Value = serde_json::from_str(&text).unwrap();
            match v[0].as_str().unwrap() {
                "EVENT" if v[1] == sub => out.push(event_object_text(&text)),
                "EOSE" if v[1] == sub => return out,
                "CLOSED" if v[1] == sub => panic!("subscription closed: {v}"),
                _ => {}
            }
        }
    }

    /// Ids of the events of a REQ, in order.
    pub async fn req_ids(&mut self, sub: &str, filters: &[Value]) -> Vec<String> {
        self.req(sub, filters)
            .await
            .iter()
            .map(|raw| Event::parse(raw).unwrap().id_hex())
            .collect()
    }

    /// Waits for the next message that is not an OK, EVENT or EOSE of
    /// some other subscription... the next message of kind `what`.
    pub async fn expect(&mut self, what: &str) -> Value {
        loop {
            let m = self.recv().await;
            if m[0] == what {
                return m;
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// The event object inside `["EVENT","sub",{...}]`, as sent.
pub fn event_object_text(msg: &str) -> String {
    let start = msg.find('{').expect("event object");
    msg[start..msg.len() - 1].to_string()
}

/// A deterministic secret key per test actor.
pub fn key(n: u8) -> [u8; 32] {
    let mut k = [n; 32];
    k[0] = 1;
    k
}

pub fn pubkey_hex(n: u8) -> String {
    sluice_proto::hex32::encode(&sluice_proto::event::public_key_of(&key(n)))
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A signed event from actor `n`.
pub fn ev(n: u8, created_at: u64, kind: u16, tags: &[&[&str]], content: &str) -> Event {
    let tags = tags
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
    Event::sign(&key(n), created_at, kind, tags, content)
}

/// Fills a new store at `store` with `events` through `sluice import` (no
/// relay may run on it meanwhile).
pub fn import_events(store: &Path, events: &[Event]) {
    let tmp = tempfile::tempdir().unwrap();
    let mut file = Vec::new();
    for e in events {
        file.extend_from_slice(e.raw().as_bytes());
        file.push(b'\n');
    }
    let path = tmp.path().join("events.jsonl");
    std::fs::write(&path, file).unwrap();
    let out = sluice_on(store)
        .arg("import")
        .arg(&path)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Plain HTTP GET over a TCP socket; returns (status, headers, body).
/// The first answer of each client of a pile that each sent one costly
/// REQ: how many were admitted (an EVENT came first; the rest of the
/// answer waits unread) and the CLOSEDs of the others. Anything else
/// fails the test.
pub async fn first_answers(pile: &mut [Client]) -> (usize, Vec<Value>) {
    let mut admitted = 0;
    let mut closed = Vec::new();
    for c in pile {
        let m = c.recv().await;
        match m[0].as_str() {
            Some("EVENT") => admitted += 1,
            Some("CLOSED") => closed.push(m),
            _ => panic!("unexpected first answer {m}"),
        }
    }
    (admitted, closed)
}

pub async fn http_get(addr: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let accept: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    http_get_with(addr, path, None, &accept).await
}

/// [`http_get`] from a chosen loopback source address, with extra headers.
pub async fn http_get_with(
    addr: &str,
    path: &str,
    source: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(src) = source {
        socket.bind(format!("{src}:0").parse().unwrap()).unwrap();
    }
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(ANSWER_TIMEOUT, s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), decode_chunked(head, body))
}

fn decode_chunked(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// Reconciles `mine` against the relay's events matching `filter`:
/// `(ids the client has and the relay lacks, ids the relay has and the
/// client lacks)`, and the number of round trips.
pub async fn reconcile(
    c: &mut Client,
    filter: Value,
    mine: &[Event],
) -> (Vec<String>, Vec<String>, usize) {
    let mut storage = negentropy::NegentropyStorageVector::new();
    for e in mine {
        storage
            .insert(e.created_at, negentropy::Id::from_byte_array(e.id))
            .unwrap();
    }
    storage.seal().unwrap();
    let mut neg = negentropy::Negentropy::owned(storage, 0).unwrap();
    let first = neg.initiate().unwrap();
    c.send(json!(["NEG-OPEN", "n", filter, hex::encode(first)]))
        .await;
    let (mut have, mut need) = (Vec::new(), Vec::new());
    let mut rounds = 0;
    loop {
        let m = c.recv().await;
        assert_eq!(m[0], "NEG-MSG", "{m}");
        rounds += 1;
        let msg = hex::decode(m[2].as_str().unwrap()).unwrap();
        match neg.reconcile_with_ids(&msg, &mut have, &mut need).unwrap() {
            Some(next) => {
                c.send(json!(["NEG-MSG", "n", hex::encode(next)])).await;
            }
            None => break,
        }
    }
    c.send(json!(["NEG-CLOSE", "n"])).await;
    let hexes = |ids: Vec<negentropy::Id>| {
        let mut v: Vec<String> = ids.iter().map(|i| hex::encode(i.as_bytes())).collect();
        v.sort();
        v
    };
    (hexes(have), hexes(need), rounds)
}

/// Mounts a tmpfs of `mb` MiB at `dir` (root in a sandbox can). Where
/// mounting is not allowed it says so and returns `None` (the test skips),
/// unless `DISK_TESTS_REQUIRE` is set, which fails the test.
pub fn tmpfs(dir: &Path, mb: u64) -> Option<Mount> {
    std::fs::create_dir_all(dir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("DISK_TESTS_REQUIRE").is_none(),
            "cannot mount a tmpfs, and DISK_TESTS_REQUIRE is set"
        );
        eprintln!("SKIPPED: mounting a tmpfs is not allowed here");
    }
    ok.then(|| Mount(dir.to_path_buf()))
}

pub struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Polls `check` every 100 ms until it holds, failing after 30 s (a wait
/// for a state, not for a duration).
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if check().await {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `sluice sync` with `args` on the store at `store`: (success, stderr).
pub async fn sync(store: &Path, args: &[&str]) -> (bool, String) {
    let mut cmd = sluice_on(store);
    cmd.arg("sync").args(args);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
