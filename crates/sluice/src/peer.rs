//! The client side of another relay, shared by `sluice sync`, the cluster's
//! repairs (`sync::pull`) and the mirrors (`mirror.rs`): connecting over
//! ws:// or wss:// ([`Tls`]: rustls with the webpki roots, plus the CA file
//! an operator gives for private peers), NIP-42 with a key, NIP-77
//! reconciliation, fetching by ids, and sending EVENTs up: paced, with
//! `rate-limited` answers sent again within a retry budget (`upload.rs`,
//! its answers read in `answer.rs`).
//!
//! Store reads run on a thread of their own ([`off_runtime`]): `serve`
//! forbids transactions on any thread in the async runtime's context.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use negentropy::{Id, Negentropy, NegentropyStorageVector};
use serde_json::{Value, json};
use sluice_proto::{Event, Filter};
use sluice_store::QueryOptions;
use sluice_store::StoreError;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream};

mod answer;
pub mod upload;

pub use upload::Uploader;

/// Ids asked for in one REQ.
pub const FETCH_BATCH: usize = 500;
/// Longest wait for any one answer of the remote.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

pub type Ws = tokio_tungstenite::WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A negentropy item: `(created_at, id)`.
pub type Item = (u64, [u8; 32]);

/// The roots a wss:// peer's certificate must chain to: the webpki roots
/// (Mozilla's), and the certificates of an operator's CA file.
#[derive(Clone)]
pub struct Tls(Arc<rustls::ClientConfig>);

impl Tls {
    /// The webpki roots, plus every certificate in the PEM file `ca_file`.
    /// An error names the file.
    pub fn new(ca_file: Option<&Path>) -> anyhow::Result<Tls> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = ca_file {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .with_context(|| format!("reading the CA file {shown}"))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("the CA file {shown} is not PEM"))?;
            if certs.is_empty() {
                bail!("the CA file {shown} holds no certificate");
            }
            for cert in certs {
                roots
                    .add(cert)
                    .with_context(|| format!("a certificate of the CA file {shown}"))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls(Arc::new(config)))
    }
}

/// Opens a WebSocket to `url` (ws:// or wss://). A certificate that does
/// not chain to a trusted root is an error saying so.
pub async fn connect(url: &str, tls: &Tls) -> anyhow::Result<Ws> {
    let connector = Connector::Rustls(tls.0.clone());
    match tokio_tungstenite::connect_async_tls_with_config(url, None, false, Some(connector)).await
    {
        Ok((ws, _)) => Ok(ws),
        Err(e) => match tls_refusal(&e) {
            Some(why) => Err(anyhow::anyhow!(
                "connecting to {url}: TLS: {why} (is the peer's certificate signed by a trusted \
                 CA? add a private CA with --ca-file or ca_file)"
            )),
            None => Err(anyhow::Error::new(e).context(format!("connecting to {url}"))),
        },
    }
}

/// The TLS layer's own error in a connection's (rustls reports a refused
/// certificate through the stream's I/O error).
fn tls_refusal(e: &tokio_tungstenite::tungstenite::Error) -> Option<String> {
    use tokio_tungstenite::tungstenite::Error as E;
    match e {
        E::Tls(t) => Some(t.to_string()),
        E::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(rustls::Error::to_string),
        _ => None,
    }
}

/// The peer's address (unspecified if the socket cannot say).
pub fn peer_ip(ws: &Ws) -> IpAddr {
    let addr = match ws.get_ref() {
        MaybeTlsStream::Plain(s) => s.peer_addr(),
        MaybeTlsStream::Rustls(s) => s.get_ref().0.peer_addr(),
        _ => return IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    addr.map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// `url` without credentials (`wss://user:pw@host/` → `wss://host/`), for
/// logs and metric labels.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}{}", &url[..scheme_end + 3], &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// The next text message, as JSON, skipping AUTH challenges and NOTICEs.
pub async fn next_text(ws: &mut Ws) -> anyhow::Result<Value> {
    loop {
        let v = next_json(ws).await?;
        if v[0] == "AUTH" || v[0] == "NOTICE" {
            continue;
        }
        return Ok(v);
    }
}

/// The next text message, as JSON.
async fn next_json(ws: &mut Ws) -> anyhow::Result<Value> {
    next_json_within(ws, ANSWER_TIMEOUT)
        .await?
        .context("the remote did not answer in time")
}

/// The next text message, as JSON; `None` when none came within `wait`.
async fn next_json_within(ws: &mut Ws, wait: Duration) -> anyhow::Result<Option<Value>> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let Ok(msg) = tokio::time::timeout_at(deadline, ws.next()).await else {
            return Ok(None);
        };
        if let Message::Text(t) = msg.context("the remote closed the connection")?? {
            let v = serde_json::from_str(&t).context("the remote sent something not JSON")?;
            return Ok(Some(v));
        }
    }
}

pub async fn send(ws: &mut Ws, v: Value) -> anyhow::Result<()> {
    ws.send(Message::Text(v.to_string().into())).await?;
    Ok(())
}

/// How long a repair waits for the challenge a peer sends at connect.
const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(5);

/// NIP-42 with `key`: waits for the challenge the peer sends at connect
/// (`auth.challenge_on_connect`), answers it and waits for OK true. An
/// error says why, for the repair's log line.
pub async fn authenticate(ws: &mut Ws, url: &str, key: &[u8; 32]) -> anyhow::Result<()> {
    let challenge = loop {
        let msg = tokio::time::timeout(CHALLENGE_TIMEOUT, ws.next())
            .await
            .with_context(|| {
                format!(
                    "the peer sent no AUTH challenge within {} s: its auth.enabled or \
                     auth.challenge_on_connect is off, and a repair with \
                     cluster.repair_secret_key needs both",
                    CHALLENGE_TIMEOUT.as_secs()
                )
            })?
            .context("the peer closed the connection")??;
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).context("the peer sent something not JSON")?;
            if v[0] == "AUTH"
                && let Some(c) = v[1].as_str()
            {
                break c.to_string();
            }
        }
    };
    let tags = vec![
        vec!["relay".to_string(), url.to_string()],
        vec!["challenge".to_string(), challenge],
    ];
    let ev = Event::try_sign(key, sluice_engine::clock::unix_now(), 22242, tags, "")
        .context("the repair key is not a secp256k1 secret key")?;
    ws.send(Message::Text(format!("[\"AUTH\",{}]", ev.raw()).into()))
        .await?;
    loop {
        let m = next_text(ws).await?;
        if m[0] == "OK" && m[1] == ev.id_hex().as_str() {
            if m[2] == true {
                return Ok(());
            }
            bail!(
                "the peer refused our AUTH: {}",
                m[3].as_str().unwrap_or_default()
            );
        }
    }
}

/// What a NIP-77 reconciliation found.
pub enum Reconciled {
    /// `have`: ids only here; `need`: ids only on the remote.
    Done {
        have: Vec<Id>,
        need: Vec<Id>,
        rounds: usize,
    },
    /// The remote does not reconcile with us: its NEG-ERR or NOTICE in
    /// answer to NEG-OPEN, or no answer at all.
    Unsupported(String),
}

/// The NEG-OPEN / NEG-MSG rounds over `filter` (its `limit` removed)
/// against the local items.
pub async fn negotiate(
    ws: &mut Ws,
    mut filter: Value,
    local: &[Item],
) -> anyhow::Result<Reconciled> {
    let mut storage = NegentropyStorageVector::with_capacity(local.len());
    for (t, id) in local {
        storage.insert(*t, Id::from_byte_array(*id))?;
    }
    storage.seal()?;
    let mut neg = Negentropy::owned(storage, 60_000)?;
    if let Some(obj) = filter.as_object_mut() {
        obj.remove("limit");
    }
    let first = neg.initiate()?;
    send(ws, json!(["NEG-OPEN", "sync", filter, hex::encode(first)])).await?;
    let (mut have, mut need): (Vec<Id>, Vec<Id>) = (Vec::new(), Vec::new());
    let mut rounds = 0;
    loop {
        let Some(m) = next_json_within(ws, ANSWER_TIMEOUT).await? else {
            if rounds == 0 {
                return Ok(Reconciled::Unsupported("no answer to NEG-OPEN".into()));
            }
            bail!("the remote did not answer in time");
        };
        match m[0].as_str() {
            Some("NEG-MSG") if m[1] == "sync" => {
                rounds += 1;
                let msg = hex::decode(m[2].as_str().unwrap_or(""))
                    .context("the remote's NEG-MSG is not hex")?;
                match neg.reconcile_with_ids(&msg, &mut have, &mut need)? {
                    Some(next) => send(ws, json!(["NEG-MSG", "sync", hex::encode(next)])).await?,
                    None => break,
                }
            }
            Some("NEG-ERR") => {
                return Ok(Reconciled::Unsupported(format!(
                    "the remote refused the reconciliation: {}",
                    m[2]
                )));
            }
            Some("NOTICE") if rounds == 0 => {
                return Ok(Reconciled::Unsupported(format!(
                    "the remote answered NEG-OPEN with a NOTICE: {}",
                    m[1]
                )));
            }
            _ => {}
        }
    }
    send(ws, json!(["NEG-CLOSE", "sync"])).await?;
    Ok(Reconciled::Done { have, need, rounds })
}

/// Fetches the events a reconciliation found missing with REQ by ids,
/// [`FETCH_BATCH`] per REQ: each [`Fetch::next`] asks for one batch and
/// returns its events that parse, were asked for and carry a valid
/// signature (the caller stores them before asking for the next).
pub struct Fetch<'a> {
    batches: std::slice::Chunks<'a, Id>,
    n: usize,
}

impl<'a> Fetch<'a> {
    pub fn new(need: &'a [Id]) -> Fetch<'a> {
        Fetch {
            batches: need.chunks(FETCH_BATCH),
            n: 0,
        }
    }

    /// The next batch's events; `None` when every batch was fetched.
    pub async fn next(&mut self, ws: &mut Ws) -> anyhow::Result<Option<Vec<Event>>> {
        let Some(batch) = self.batches.next() else {
            return Ok(None);
        };
        let sub = format!("get{}", self.n);
        self.n += 1;
        let ids: Vec<String> = batch.iter().map(|i| hex::encode(i.as_bytes())).collect();
        let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
        send(ws, json!(["REQ", sub, {"ids": ids, "limit": batch.len()}])).await?;
        let mut events = Vec::new();
        loop {
            let m = next_text(ws).await?;
            match m[0].as_str() {
                Some("EVENT") if m[1] == sub.as_str() => {
                    let raw = m[2].to_string();
                    let Ok(ev) = Event::parse(&raw) else { continue };
                    if !wanted.contains(ev.id_hex().as_str()) || ev.verify().is_err() {
                        continue;
                    }
                    events.push(ev);
                }
                Some("EOSE") if m[1] == sub.as_str() => break,
                Some("CLOSED") if m[1] == sub.as_str() => {
                    bail!("the remote closed a fetch: {}", m[2])
                }
                _ => {}
            }
        }
        send(ws, json!(["CLOSE", sub])).await?;
        Ok(Some(events))
    }
}

/// `(id hex, raw JSON)` of the stored events among `ids` (gone ones
/// skipped).
fn read_raws(
    store: &sluice_store::Store,
    ids: &[[u8; 32]],
) -> anyhow::Result<Vec<(String, String)>> {
    let now = sluice_engine::clock::unix_now();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let raw = store
            .get(id, now)
            .map_err(|e: StoreError| anyhow::anyhow!("reading a local event: {e}"))?;
        if let Some(raw) = raw {
            out.push((hex::encode(id), raw.to_string()));
        }
    }
    Ok(out)
}

/// `(created_at, id)` of the stored events matching `filter`.
pub fn local_items(store: &sluice_store::Store, filter: &Filter) -> anyhow::Result<Vec<Item>> {
    let opts = QueryOptions {
        now: sluice_engine::clock::unix_now(),
        max_scan_rows: u64::MAX,
    };
    let out = store
        .query(std::slice::from_ref(filter), &opts)
        .context("reading the local store")?;
    let mut items = Vec::with_capacity(out.events.len());
    for raw in &out.events {
        let ev = Event::parse(raw).context("a stored event does not parse")?;
        items.push((ev.created_at, ev.id));
    }
    Ok(items)
}

/// Runs `f` (store reads) on a thread of its own named `name`, outside the
/// async runtime, and waits for its answer.
pub async fn off_runtime<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .with_context(|| format!("starting the {name} thread"))?;
    rx.await
        .with_context(|| format!("the {name} thread failed"))?
}

/// The wait before the next connection after `failures` failures in a row:
/// `min_ms` doubled per failure, at most `max_ms`, then a random half of
/// it taken off (so clients that lost their peer together do not come back
/// together).
pub fn backoff(min_ms: u64, max_ms: u64, failures: u32) -> Duration {
    let ms = min_ms.saturating_mul(1u64 << failures.min(30)).min(max_ms);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let jitter = random % (ms / 2 + 1);
    Duration::from_millis(ms - jitter)
}

/// Which way events move (`sync`, `mirror`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Down,
    Up,
    Both,
}

impl Direction {
    pub fn down(self) -> bool {
        self != Direction::Up
    }

    pub fn up(self) -> bool {
        self != Direction::Down
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn credentials_are_cut_from_a_url() {
        assert_eq!(redact("wss://u:p@relay.example/x"), "wss://relay.example/x");
        assert_eq!(redact("ws://127.0.0.1:7777"), "ws://127.0.0.1:7777");
        assert_eq!(redact("wss://relay.example/a@b"), "wss://relay.example/a@b");
    }
}
