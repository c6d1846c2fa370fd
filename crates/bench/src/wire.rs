//! The WebSocket client side of NIP-01: connecting to a relay URL (optionally
//! from a chosen local address, so one machine can look like many clients;
//! `loopback_spread` names such addresses and `raise_fd_limit` lets this
//! process hold many sockets), parsing the relay messages a benchmark needs without allocating for the
//! event bodies, and pre-built `["EVENT", ...]` messages.
//!
//! Only `ws://` URLs are supported: benchmarks run next to the relay, not
//! through a TLS proxy.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// One client connection.
pub type Ws = WebSocketStream<TcpStream>;

/// How long a TCP connect plus WebSocket handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed `ws://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayUrl {
    pub url: String,
    pub host: String,
    pub port: u16,
}

impl RelayUrl {
    pub fn parse(url: &str) -> anyhow::Result<RelayUrl> {
        let Some(rest) = url.strip_prefix("ws://") else {
            bail!("relay URL must start with ws:// (wss:// is not supported): {url}");
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h, p.parse().with_context(|| format!("bad port in {url}"))?)
            }
            _ => (authority, 80),
        };
        if host.is_empty() {
            bail!("no host in {url}");
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(RelayUrl {
            url: url.to_owned(),
            host,
            port,
        })
    }

    /// The relay's HTTP base (`http://host:port`), where Sluice serves /metrics.
    pub fn http_base(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }

    pub async fn socket_addr(&self) -> anyhow::Result<SocketAddr> {
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .next()
            .with_context(|| format!("cannot resolve {}", self.host))
    }
}

/// Opens a WebSocket to the relay, from `bind` when given.
pub async fn connect(relay: &RelayUrl, bind: Option<IpAddr>) -> anyhow::Result<Ws> {
    tokio::time::timeout(CONNECT_TIMEOUT, connect_inner(relay, bind))
        .await
        .with_context(|| format!("connecting to {} timed out", relay.url))?
}

async fn connect_inner(relay: &RelayUrl, bind: Option<IpAddr>) -> anyhow::Result<Ws> {
    let stream = tcp_connect(relay, bind).await?;
    let (ws, _) = tokio_tungstenite::client_async(relay.url.as_str(), stream)
        .await
        .with_context(|| format!("WebSocket handshake with {}", relay.url))?;
    Ok(ws)
}

/// A TCP connection to the relay (no delay), from `bind` when given: what
/// `connect` and the raw client (`wsraw`) speak WebSocket over.
pub async fn tcp_connect(relay: &RelayUrl, bind: Option<IpAddr>) -> anyhow::Result<TcpStream> {
    let addr = relay.socket_addr().await?;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = bind {
        socket
            .bind(SocketAddr::new(ip, 0))
            .with_context(|| format!("binding {ip}"))?;
    }
    let stream = socket
        .connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Most source addresses `loopback_spread` hands out: 127.0.0.2 to 127.0.0.254.
pub const MAX_LOOPBACK_SPREAD: usize = 253;

/// `count` loopback source addresses from 127.0.0.2 upward, for spreading
/// connections to a relay on loopback over several client addresses (so
/// neither one address's ephemeral ports nor a per-IP cap decides a result).
/// Linux routes all of 127/8 to `lo`, so each can be bound without setup.
pub fn loopback_spread(count: usize) -> anyhow::Result<Vec<IpAddr>> {
    if count > MAX_LOOPBACK_SPREAD {
        bail!(
            "at most {MAX_LOOPBACK_SPREAD} loopback source addresses (127.0.0.2-254), not {count}"
        );
    }
    Ok((0..count)
        .map(|i| IpAddr::from([127, 0, 0, 2 + i as u8]))
        .collect())
}

/// The open-file limit of this process before and after `raise_fd_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FdLimit {
    pub soft_before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (to the
/// kernel's `fs.nr_open` when the hard limit is unlimited): one socket per
/// connection, and 10k connections need more than the usual 1,024.
pub fn raise_fd_limit() -> std::io::Result<FdLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let soft_before = lim.rlim_cur;
    // An unlimited hard limit still stops at the kernel's fs.nr_open.
    let target = if lim.rlim_max == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        lim.rlim_max
    };
    if lim.rlim_cur < target {
        lim.rlim_cur = target;
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(FdLimit {
        soft_before,
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// An event ready to send: its id and the whole `["EVENT",<event>]` text.
/// Cloning is a reference-count increment.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub id: [u8; 32],
    pub message: Utf8Bytes,
}

impl Prepared {
    /// From one line of JSONL (an event object).
    pub fn from_raw(raw: &str) -> anyhow::Result<Prepared> {
        let raw = raw.trim();
        let ev: IdOnly<'_> = serde_json::from_str(raw).context("not an event object")?;
        let id = id_of(ev.id).context("event id is not 64 hex characters")?;
        Ok(Prepared {
            id,
            message: format!("[\"EVENT\",{raw}]").into(),
        })
    }

    pub fn to_message(&self) -> Message {
        Message::Text(self.message.clone())
    }
}

/// The relay messages the benchmarks act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Ok {
        id: [u8; 32],
        accepted: bool,
        message: String,
    },
    /// An event for a subscription; only its id is kept.
    Event {
        sub: String,
        id: [u8; 32],
    },
    Eose {
        sub: String,
    },
    Closed {
        sub: String,
        message: String,
    },
    Notice {
        message: String,
    },
    /// Anything else (AUTH, COUNT, unknown or malformed).
    Other,
}

#[derive(Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow)]
    id: &'a str,
}

fn str_at(parts: &[&RawValue], i: usize) -> Option<String> {
    serde_json::from_str(parts.get(i)?.get()).ok()
}

fn id_of(hex_id: &str) -> Option<[u8; 32]> {
    let mut id = [0u8; 32];
    hex::decode_to_slice(hex_id, &mut id).ok()?;
    Some(id)
}

impl Incoming {
    pub fn parse(text: &str) -> Incoming {
        Self::try_parse(text).unwrap_or(Incoming::Other)
    }

    fn try_parse(text: &str) -> Option<Incoming> {
        let parts: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        let label: &str = serde_json::from_str(parts.first()?.get()).ok()?;
        Some(match label {
            "OK" => Incoming::Ok {
                id: id_of(&str_at(&parts, 1)?)?,
                accepted: serde_json::from_str(parts.get(2)?.get()).ok()?,
                message: str_at(&parts, 3).unwrap_or_default(),
            },
            "EVENT" => {
                let ev: IdOnly<'_> = serde_json::from_str(parts.get(2)?.get()).ok()?;
                Incoming::Event {
                    sub: str_at(&parts, 1)?,
                    id: id_of(ev.id)?,
                }
            }
            "EOSE" => Incoming::Eose {
                sub: str_at(&parts, 1)?,
            },
            "CLOSED" => Incoming::Closed {
                sub: str_at(&parts, 1)?,
                message: str_at(&parts, 2).unwrap_or_default(),
            },
            "NOTICE" => Incoming::Notice {
                message: str_at(&parts, 1).unwrap_or_default(),
            },
            _ => Incoming::Other,
        })
    }

    /// The subscription of an `["EVENT","sub",{...}]` message as relays
    /// write it (no space after the commas, a subscription id without
    /// escapes), read from its first bytes without parsing the event: the
    /// query scenario only counts events, and a full parse of every result
    /// would make the load generator's cost, not the relay's, set the rate.
    /// `None` for anything else, which the caller parses in full.
    pub fn event_sub(text: &str) -> Option<&str> {
        let rest = text.strip_prefix("[\"EVENT\",\"")?;
        let end = rest.find('"')?;
        let sub = &rest[..end];
        (!sub.contains('\\') && rest[end..].starts_with("\",{")).then_some(sub)
    }

    /// Parses a WebSocket message; `None` for pings, pongs and binary frames
    /// (tungstenite answers pings itself) and for a close frame.
    pub fn from_message(msg: &Message) -> Option<Incoming> {
        match msg {
            Message::Text(t) => Some(Incoming::parse(t.as_str())),
            _ => None,
        }
    }
}

/// `["REQ", sub, filter]`.
pub fn req(sub: &str, filter: &serde_json::Value) -> Message {
    Message::Text(serde_json::json!(["REQ", sub, filter]).to_string().into())
}

/// `["CLOSE", sub]`.
pub fn close(sub: &str) -> Message {
    Message::Text(serde_json::json!(["CLOSE", sub]).to_string().into())
}

#[cfg(test)]
mod tests;
