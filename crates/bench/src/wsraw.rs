//! A small RFC 6455 client written by hand, for what tokio-tungstenite
//! cannot do: negotiate permessage-deflate (RFC 7692) and count every byte
//! that crosses the socket. The handshake is written and parsed here
//! (offering `permessage-deflate; client_max_window_bits` unless told not
//! to); server frames are read, compressed messages inflated (the zlib state
//! kept across messages unless `server_no_context_takeover` was agreed),
//! fragments joined, pings answered; client frames are masked and, when
//! asked, compressed. Frame parsing, the extension parameters and the
//! deflate state machines live in `codec`, without a socket.
//!
//! Counted apart: the handshake bytes each way, then the bytes of every
//! frame written and read after it, each message's wire and inflated size.

pub mod codec;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::rng::Rng;
use crate::wire::{self, RelayUrl};
use codec::{
    DeflateParams, Deflater, Frame, Msg, MsgSize, OP_CLOSE, OP_PONG, OP_TEXT, Reader, encode_frame,
    parse_frame,
};

/// How long the TCP connect plus the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest handshake answer read.
const MAX_HANDSHAKE: usize = 16 * 1024;
/// Seeds the masks of successive connections (masks need no secrecy here).
static MASK_SEED: AtomicU64 = AtomicU64::new(0x5eed_6455);
/// The extension offer: permessage-deflate, any client window the server wants.
pub const DEFLATE_OFFER: &str = "permessage-deflate; client_max_window_bits";

/// How to open a connection.
#[derive(Debug, Clone)]
pub struct Options {
    /// Offer permessage-deflate in the handshake.
    pub offer_deflate: bool,
    /// Compress the messages this client sends, when the extension was agreed.
    pub compress_sends: bool,
    /// Keep data messages (false: count and drop them, never inflating
    /// more than the server's sliding window needs).
    pub keep_data: bool,
    pub bind: Option<IpAddr>,
    /// Largest message accepted, after inflating.
    pub max_message: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            offer_deflate: true,
            compress_sends: false,
            keep_data: true,
            bind: None,
            max_message: 16 << 20,
        }
    }
}

/// Bytes and messages that crossed one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Counters {
    /// The upgrade request.
    pub handshake_sent: u64,
    /// The 101 answer, up to its blank line.
    pub handshake_received: u64,
    /// Frames written after the handshake, headers and masks included.
    pub sent: u64,
    /// Frames read after the handshake, headers included.
    pub received: u64,
    pub messages_sent: u64,
    pub compressed_sent: u64,
    /// Payload bytes of the data messages sent, before compressing.
    pub payload_sent: u64,
    /// Data messages received (control frames are counted in `received` only).
    pub messages_received: u64,
    pub compressed_received: u64,
    /// Payload bytes of the data messages received, after inflating.
    pub payload_received: u64,
    /// What the data messages received would have taken uncompressed, each
    /// in one frame: `payload_received` plus frame headers.
    pub plain_received: u64,
}

/// What the server agreed to in its 101.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The `Sec-WebSocket-Extensions` answer as sent (header lines joined
    /// by ", "); `None` when there was none.
    pub extensions: Option<String>,
    pub deflate: Option<DeflateParams>,
}

/// One client connection.
pub struct WsRaw {
    stream: TcpStream,
    /// Bytes read and not yet parsed start at `pos`.
    buf: Vec<u8>,
    pos: usize,
    /// Frames queued for writing (a write interrupted by cancellation
    /// resumes on the next call, so frames never interleave).
    out: Vec<u8>,
    reader: Reader,
    deflater: Option<Deflater>,
    handshake: Handshake,
    counters: Counters,
    max_message: usize,
    rng: Rng,
    close_sent: bool,
}

/// The `GET` that asks for the upgrade.
pub fn handshake_request(relay: &RelayUrl, key: &str, offer_deflate: bool) -> String {
    let rest = relay.url.strip_prefix("ws://").unwrap_or(&relay.url);
    let target = rest.find('/').map_or("/", |i| &rest[i..]);
    let authority = rest.split('/').next().unwrap_or_default();
    let mut req = format!(
        "GET {target} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    if offer_deflate {
        req.push_str(&format!("Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n"));
    }
    req.push_str("\r\n");
    req
}

/// Checks a 101 answer (its head, without the blank line) against the key
/// sent and reads the extension the server agreed to.
pub fn parse_handshake(head: &str, key: &str, offered_deflate: bool) -> anyhow::Result<Handshake> {
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let mut words = status.split_whitespace();
    ensure!(
        words.next().is_some_and(|v| v.starts_with("HTTP/1.")) && words.next() == Some("101"),
        "the relay answered the upgrade with {status:?}"
    );
    let (mut upgrade, mut connection, mut accept, mut extensions) =
        (false, false, None, Vec::new());
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .with_context(|| format!("bad header line {line:?}"))?;
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "upgrade" => upgrade = value.eq_ignore_ascii_case("websocket"),
            "connection" => {
                connection = value
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            }
            "sec-websocket-accept" => accept = Some(value.to_owned()),
            "sec-websocket-extensions" => extensions.push(value.to_owned()),
            _ => {}
        }
    }
    ensure!(
        upgrade && connection,
        "the 101 lacks Upgrade: websocket or Connection: Upgrade"
    );
    let expected = derive_accept_key(key.as_bytes());
    ensure!(
        accept.as_deref() == Some(expected.as_str()),
        "Sec-WebSocket-Accept {accept:?} is not {expected:?}"
    );
    let extensions = (!extensions.is_empty()).then(|| extensions.join(", "));
    let deflate = match &extensions {
        Some(e) if !offered_deflate => bail!("extension agreed without an offer: {e}"),
        Some(e) => codec::parse_extensions(e, true)?,
        None => None,
    };
    Ok(Handshake {
        extensions,
        deflate,
    })
}

impl WsRaw {
    /// Opens a connection and completes the upgrade.
    pub async fn connect(relay: &RelayUrl, opts: &Options) -> anyhow::Result<WsRaw> {
        tokio::time::timeout(CONNECT_TIMEOUT, Self::connect_inner(relay, opts))
            .await
            .with_context(|| format!("connecting to {} timed out", relay.url))?
    }

    async fn connect_inner(relay: &RelayUrl, opts: &Options) -> anyhow::Result<WsRaw> {
        let mut stream = wire::tcp_connect(relay, opts.bind).await?;
        let key = generate_key();
        let request = handshake_request(relay, &key, opts.offer_deflate);
        stream.write_all(request.as_bytes()).await?;
        let mut buf = Vec::with_capacity(4096);
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            ensure!(
                buf.len() < MAX_HANDSHAKE,
                "handshake answer over {MAX_HANDSHAKE} bytes"
            );
            buf.reserve(4096);
            if stream.read_buf(&mut buf).await? == 0 {
                bail!("the relay closed the connection during the handshake");
            }
        };
        let head =
            std::str::from_utf8(&buf[..head_end - 4]).context("handshake answer is not text")?;
        let handshake = parse_handshake(head, &key, opts.offer_deflate)
            .with_context(|| format!("WebSocket handshake with {}", relay.url))?;
        let deflater = handshake
            .deflate
            .as_ref()
            .filter(|_| opts.compress_sends)
            .and_then(Deflater::new);
        Ok(WsRaw {
            stream,
            buf,
            pos: head_end,
            out: Vec::new(),
            reader: Reader::new(handshake.deflate.as_ref(), opts.max_message, opts.keep_data),
            deflater,
            counters: Counters {
                handshake_sent: request.len() as u64,
                handshake_received: head_end as u64,
                ..Counters::default()
            },
            handshake,
            max_message: opts.max_message,
            rng: Rng::new(MASK_SEED.fetch_add(1, Ordering::Relaxed) ^ crate::report::unix_now()),
            close_sent: false,
        })
    }

    pub fn handshake(&self) -> &Handshake {
        &self.handshake
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    fn queue(&mut self, opcode: u8, rsv1: bool, payload: &[u8]) {
        let mask = (self.rng.next_u64() as u32).to_ne_bytes();
        let frame = encode_frame(opcode, rsv1, payload, mask);
        self.counters.sent += frame.len() as u64;
        self.out.extend_from_slice(&frame);
    }

    /// Writes what is queued. Cancel-safe: the queue only shrinks by what
    /// a completed write took.
    async fn flush(&mut self) -> anyhow::Result<()> {
        while !self.out.is_empty() {
            let n = self.stream.write(&self.out).await?;
            ensure!(n > 0, "the relay closed the connection");
            self.out.drain(..n);
        }
        Ok(())
    }

    /// Sends a text message, compressed when that was asked and agreed.
    pub async fn send_text(&mut self, text: &str) -> anyhow::Result<()> {
        self.counters.messages_sent += 1;
        self.counters.payload_sent += text.len() as u64;
        match &mut self.deflater {
            Some(d) => {
                let data = d.deflate(text.as_bytes());
                self.counters.compressed_sent += 1;
                self.queue(OP_TEXT, true, &data);
            }
            None => self.queue(OP_TEXT, false, text.as_bytes()),
        }
        self.flush().await
    }

    /// The next data message (or the server's close) and what it cost;
    /// `None` once the connection is closed. Pings are answered on the way.
    /// Cancel-safe: a message half read stays in the buffer.
    pub async fn recv(&mut self) -> anyhow::Result<Option<(Msg, MsgSize)>> {
        loop {
            while let Some((frame, used)) = parse_frame(&self.buf[self.pos..], self.max_message)? {
                self.pos += used;
                self.counters.received += used as u64;
                if let Some(got) = self.on_frame(frame, used)? {
                    self.flush().await?;
                    return Ok(Some(got));
                }
            }
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            // A pong (or close) queued above goes out before waiting for more.
            self.flush().await?;
            self.buf.reserve(16 * 1024);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }

    fn on_frame(&mut self, frame: Frame, used: usize) -> anyhow::Result<Option<(Msg, MsgSize)>> {
        let Some((msg, size)) = self.reader.push(frame, used)? else {
            return Ok(None);
        };
        match msg {
            Msg::Ping(payload) => {
                self.queue(OP_PONG, false, &payload);
                Ok(None)
            }
            Msg::Pong(_) => Ok(None),
            Msg::Close(code) => {
                if !self.close_sent {
                    self.close_sent = true;
                    let echo = code.map(u16::to_be_bytes);
                    self.queue(OP_CLOSE, false, echo.as_ref().map_or(&[][..], |c| &c[..]));
                }
                Ok(Some((Msg::Close(code), size)))
            }
            data => {
                self.counters.messages_received += 1;
                self.counters.compressed_received += u64::from(size.compressed);
                self.counters.payload_received += size.payload as u64;
                self.counters.plain_received += codec::server_frame_len(size.payload) as u64;
                Ok(Some((data, size)))
            }
        }
    }

    /// Sends a close (1000) and waits up to `wait` for the server's.
    pub async fn close(mut self, wait: Duration) {
        if !self.close_sent {
            self.close_sent = true;
            self.queue(OP_CLOSE, false, &1000u16.to_be_bytes());
        }
        let _ = tokio::time::timeout(wait, async {
            while let Ok(Some((m, _))) = self.recv().await {
                if matches!(m, Msg::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests;
