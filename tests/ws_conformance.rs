//! RFC 6455 (WebSocket) conformance of the relay's own server layer
//! (`crates/ws/src/`), case by case after the sections of the
//! Autobahn|Testsuite, and RFC 7692 (permessage-deflate) in
//! [`compression`].
//!
//! Every case speaks raw TCP to the real binary: the opening handshake is
//! written by hand, client frames are built and masked here, and server
//! frames are parsed here (and checked: never masked; no reserved bit but
//! RSV1, and that only on a message's first frame once permessage-deflate
//! is agreed; control frames whole and at most 125 bytes; text UTF-8).
//!
//! Where Autobahn expects an echo, a Nostr relay answers with NIP-01
//! messages: a text that is JSON is a REQ padded to the length wanted
//! (answered with its EOSE, which proves it arrived whole), a text that is
//! not JSON and a binary message get a NOTICE. docs/testing.md
//! ("WebSocket conformance") lists where a case differs from Autobahn.
//!
//! One relay per configuration is shared by the cases (started at first
//! use, stopped when the test process exits); each case opens its own
//! connection(s).

#[path = "support/mod.rs"]
mod support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once, PoisonError};

use serde_json::Value;
use support::{ANSWER_TIMEOUT, Relay};

// ------------------------------------------------------------ shared relays

/// `limits.max_message_bytes` of every relay here.
const LIMIT: usize = 100_000;
/// The WebSocket layer's bound on a frame and on a message: twice the
/// limit, so that a message over the limit still gets its NIP-01 answer.
const BOUND: usize = 2 * LIMIT;

/// The relays shared by the cases, by name.
static RELAYS: Mutex<Vec<(&'static str, Relay)>> = Mutex::new(Vec::new());
static STOP_AT_EXIT: Once = Once::new();

unsafe extern "C" {
    /// C's `atexit` (in the C library std links): statics are never
    /// dropped, so the shared relays are stopped from here.
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn stop_shared_relays() {
    let relays = std::mem::take(&mut *RELAYS.lock().unwrap_or_else(PoisonError::into_inner));
    // Each is killed and its temporary store removed.
    drop(relays);
}

/// The address of the relay shared under `name`, started with `env` (on
/// top of the settings every relay here has) at its first use.
fn shared_relay(name: &'static str, env: &[(&str, &str)]) -> String {
    let mut relays = RELAYS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, r)) = relays.iter().find(|(n, _)| *n == name) {
        return r.addr.clone();
    }
    STOP_AT_EXIT.call_once(|| {
        // SAFETY: registers a function that takes nothing and returns
        // nothing, as atexit wants; it runs once, at exit.
        let registered = unsafe { atexit(stop_shared_relays) };
        assert_eq!(registered, 0, "atexit failed");
    });
    let limit = LIMIT.to_string();
    let mut all = vec![
        ("SLUICE_LIMITS__MAX_MESSAGE_BYTES", limit.as_str()),
        // No AUTH challenge at connect: the first frame a case reads is the
        // answer to what it sent.
        ("SLUICE_AUTH__CHALLENGE_ON_CONNECT", "false"),
        // Many cases from one address in a burst: no per-client limits.
        ("SLUICE_THROTTLE__MODE", "off"),
    ];
    all.extend_from_slice(env);
    let relay = Relay::start_with(&all);
    let addr = relay.addr.clone();
    relays.push((name, relay));
    addr
}

/// The relay of the RFC 6455 cases (its default `server.compression`: the
/// clients of these cases offer no extension).
fn core() -> String {
    shared_relay("core", &[])
}

// ------------------------------------------------------------ client frames

const CONT: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// Reserved bits, numbered as Autobahn does (3 bits, RSV1 the highest).
const RSV1: u8 = 4;
const RSV2: u8 = 2;
const RSV3: u8 = 1;

/// A new masking key per frame, no byte of it zero.
fn next_mask() -> [u8; 4] {
    static SEED: AtomicU32 = AtomicU32::new(0x9e37_79b9);
    let n = SEED.fetch_add(0x6d2b_79f5, Ordering::Relaxed);
    let n = (n ^ (n >> 15)).wrapping_mul(0x2c1b_3c6d);
    (n | 0x0101_0101).to_be_bytes()
}

fn push_len(f: &mut Vec<u8>, mask_bit: u8, len: u64) {
    if len < 126 {
        f.push(mask_bit | len as u8);
    } else if let Ok(n) = u16::try_from(len) {
        f.push(mask_bit | 126);
        f.extend_from_slice(&n.to_be_bytes());
    } else {
        f.push(mask_bit | 127);
        f.extend_from_slice(&len.to_be_bytes());
    }
}

/// A client frame: FIN, reserved bits (`RSV1`...), opcode, and the payload
/// masked (RFC 6455 section 5.3).
fn frame(fin: bool, rsv: u8, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 14);
    f.push((u8::from(fin) << 7) | ((rsv & 7) << 4) | (opcode & 0x0f));
    push_len(&mut f, 0x80, payload.len() as u64);
    let mask = next_mask();
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    f
}

/// Only the header (with its mask) of a masked frame announcing `len`
/// bytes, for frames the relay must refuse from their header.
fn header_only(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut f = vec![(u8::from(fin) << 7) | opcode];
    push_len(&mut f, 0x80, len);
    f.extend_from_slice(&next_mask());
    f
}

fn text(p: &[u8]) -> Vec<u8> {
    frame(true, 0, TEXT, p)
}

fn binary(p: &[u8]) -> Vec<u8> {
    frame(true, 0, BINARY, p)
}

fn ping(p: &[u8]) -> Vec<u8> {
    frame(true, 0, PING, p)
}

fn pong(p: &[u8]) -> Vec<u8> {
    frame(true, 0, PONG, p)
}

/// The first frame of a fragmented text message.
fn text_first(p: &[u8]) -> Vec<u8> {
    frame(false, 0, TEXT, p)
}

/// A continuation frame.
fn cont(fin: bool, p: &[u8]) -> Vec<u8> {
    frame(fin, 0, CONT, p)
}

fn close_body(code: u16, reason: &[u8]) -> Vec<u8> {
    let mut b = code.to_be_bytes().to_vec();
    b.extend_from_slice(reason);
    b
}

fn close(code: u16, reason: &[u8]) -> Vec<u8> {
    frame(true, 0, CLOSE, &close_body(code, reason))
}

/// `message` as a text message in fragments of at most `size` bytes
/// (every frame one write when sent by [`Ws::send_frames`]).
fn fragmented(opcode: u8, message: &[u8], size: usize) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = if message.is_empty() {
        vec![&[]]
    } else {
        message.chunks(size.max(1)).collect()
    };
    let last = chunks.len() - 1;
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let op = if i == 0 { opcode } else { CONT };
            frame(i == last, 0, op, c)
        })
        .collect()
}

/// The filter of every probe REQ: a kind no case publishes, so that the
/// subscription (open after its EOSE) never gets an event, stored or live,
/// from the cases sharing the relay.
const NOTHING: &str = r#"{"kinds":[65000],"limit":0}"#;

/// A REQ of exactly `len` bytes (padded with spaces, which JSON allows
/// between elements), answered with `["EOSE",sub]`: its answer proves it
/// arrived whole.
fn req(sub: &str, len: usize) -> Vec<u8> {
    let head = format!(r#"["REQ","{sub}",{NOTHING}"#);
    assert!(
        len > head.len(),
        "a REQ takes at least {} bytes",
        head.len() + 1
    );
    let mut m = head.into_bytes();
    m.resize(len - 1, b' ');
    m.push(b']');
    m
}

/// The shortest REQ of [`req`].
fn short_req(sub: &str) -> Vec<u8> {
    format!(r#"["REQ","{sub}",{NOTHING}]"#).into_bytes()
}

/// A REQ whose tag filter holds `value` as raw bytes (UTF-8 or not):
/// answered with `["EOSE",sub]` when it is valid UTF-8.
fn tag_req(sub: &str, value: &[u8]) -> Vec<u8> {
    let mut m = format!(r##"["REQ","{sub}",{{"kinds":[65000],"limit":0,"#t":[""##).into_bytes();
    m.extend_from_slice(value);
    m.extend_from_slice(br#""]}]"#);
    m
}

// ------------------------------------------------------------- the client

/// A message (or what ended the stream) from the relay.
enum Msg {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    /// The code (none for an empty body) and the reason.
    Close(Option<u16>, String),
    /// The TCP connection ended (EOF or reset) with no Close frame.
    Gone,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn short(b: &[u8]) -> String {
            let s = String::from_utf8_lossy(&b[..b.len().min(120)]).into_owned();
            if b.len() > 120 {
                format!("{s}... ({} bytes)", b.len())
            } else {
                s
            }
        }
        match self {
            Msg::Text(t) => write!(f, "Text({})", short(t.as_bytes())),
            Msg::Binary(b) => write!(f, "Binary({})", short(b)),
            Msg::Ping(b) => write!(f, "Ping({})", short(b)),
            Msg::Pong(b) => write!(f, "Pong({})", short(b)),
            Msg::Close(code, reason) => write!(f, "Close({code:?}, {reason:?})"),
            Msg::Gone => f.write_str("TCP closed without a Close frame"),
        }
    }
}

/// A server frame.
struct Frame {
    fin: bool,
    rsv: u8,
    opcode: u8,
    payload: Vec<u8>,
}

/// What was agreed of permessage-deflate (RFC 7692) in the 101 answer.
#[derive(Debug, Clone)]
struct Pmd {
    /// The answer's parameters, names in lowercase, in order.
    params: Vec<(String, Option<String>)>,
    server_no_context: bool,
    /// The relay's window (15 unless `server_max_window_bits` was agreed).
    server_bits: u8,
    /// The window this client compresses with.
    client_bits: u8,
}

impl Pmd {
    fn names(&self) -> Vec<&str> {
        self.params.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// One raw WebSocket connection to the relay.
struct Ws {
    s: TcpStream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
    /// The case this connection serves, named in every failure.
    case: String,
    /// The 101 answer's `Sec-WebSocket-Extensions` values.
    extensions: Vec<String>,
    deflate: Option<Pmd>,
    /// The inflater of the relay's messages, kept across them (context
    /// takeover) unless `server_no_context_takeover` was agreed.
    inflater: Option<flate2::Decompress>,
    /// The last data message read was compressed (RSV1).
    last_compressed: bool,
}

/// The `Sec-WebSocket-Key` of RFC 6455 section 1.3, and its accept value.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

impl Ws {
    /// Opens a connection offering no extension: the 101 must agree none.
    fn open(addr: &str, case: &str) -> Ws {
        let ws = Ws::offer(addr, case, &[]);
        assert!(
            ws.extensions.is_empty(),
            "{case}: an extension agreed that was not offered (RFC 6455 4.2.2): {:?}",
            ws.extensions
        );
        ws
    }

    /// Opens a connection with one `Sec-WebSocket-Extensions` header line
    /// per value of `extensions` (RFC 6455 section 4.1, 9.1).
    fn offer(addr: &str, case: &str, extensions: &[&str]) -> Ws {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{case}: connect: {e}"));
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        let mut request = format!(
            "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n"
        );
        for e in extensions {
            request.push_str(&format!("Sec-WebSocket-Extensions: {e}\r\n"));
        }
        request.push_str("\r\n");
        s.write_all(request.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 4096];
            let n = s
                .read(&mut chunk)
                .unwrap_or_else(|e| panic!("{case}: no 101 answer: {e}"));
            assert!(n > 0, "{case}: the connection closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
        let rest = buf[head_end + 4..].to_vec();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or_default();
        assert!(
            status.starts_with("HTTP/1.1 101"),
            "{case}: the upgrade was refused: {head}"
        );
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let get = |name: &str| -> Vec<String> {
            headers
                .iter()
                .filter(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .collect()
        };
        assert_eq!(
            get("sec-websocket-accept"),
            [ACCEPT],
            "{case}: Sec-WebSocket-Accept (RFC 6455 4.2.2)"
        );
        let extensions = get("sec-websocket-extensions");
        let deflate = (!extensions.is_empty()).then(|| parse_agreed(case, &extensions.join(",")));
        Ws {
            s,
            buf: rest,
            case: case.to_string(),
            extensions,
            deflate,
            inflater: None,
            last_compressed: false,
        }
    }

    /// Writes `bytes` at once. A write the relay refuses (it failed the
    /// connection already) is not an error here: what it sent is read next.
    fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.s.write_all(bytes) {
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                ),
                "{}: write: {e}",
                self.case
            );
        }
    }

    /// Writes each frame with a write of its own.
    fn send_frames(&mut self, frames: &[Vec<u8>]) {
        for f in frames {
            self.send(f);
        }
    }

    /// Writes `bytes` in writes of `chop` bytes (TCP_NODELAY: each leaves
    /// on its own, so the relay sees frames cut anywhere).
    fn send_chopped(&mut self, bytes: &[u8], chop: usize) {
        for c in bytes.chunks(chop) {
            self.send(c);
        }
    }

    /// The next server frame; `None` once the TCP connection ended.
    fn read_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some((f, used)) = parse_server_frame(&self.case, &self.buf) {
                self.buf.drain(..used);
                return Some(f);
            }
            let mut chunk = vec![0u8; 65_536];
            match self.s.read(&mut chunk) {
                Ok(0) => {
                    assert!(
                        self.buf.is_empty(),
                        "{}: the connection ended inside a frame",
                        self.case
                    );
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!(
                        "{}: nothing from the relay within {ANSWER_TIMEOUT:?}",
                        self.case
                    )
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::BrokenPipe
                    ) =>
                {
                    return None;
                }
                Err(e) => panic!("{}: read: {e}", self.case),
            }
        }
    }

    /// The next message: control frames as they come (also between the
    /// fragments of a data message), data messages whole and inflated.
    fn next(&mut self) -> Msg {
        let mut data: Option<(u8, bool, Vec<u8>)> = None;
        loop {
            let Some(f) = self.read_frame() else {
                assert!(
                    data.is_none(),
                    "{}: the connection ended inside a fragmented message",
                    self.case
                );
                return Msg::Gone;
            };
            let case = &self.case;
            if f.rsv & (RSV2 | RSV3) != 0 {
                panic!("{case}: the relay set RSV2/RSV3 (RFC 6455 5.2)");
            }
            match f.opcode {
                PING | PONG | CLOSE => {
                    assert!(f.rsv == 0, "{case}: RSV1 on a control frame (RFC 7692 6.1)");
                    return match f.opcode {
                        PING => Msg::Ping(f.payload),
                        PONG => Msg::Pong(f.payload),
                        _ => close_message(case, &f.payload),
                    };
                }
                TEXT | BINARY => {
                    assert!(
                        data.is_none(),
                        "{case}: a new data frame inside a fragmented message (RFC 6455 5.4)"
                    );
                    let compressed = f.rsv & RSV1 != 0;
                    assert!(
                        !compressed || self.deflate.is_some(),
                        "{case}: RSV1 with no extension agreed (RFC 6455 5.2)"
                    );
                    data = Some((f.opcode, compressed, f.payload));
                }
                CONT => {
                    assert!(
                        f.rsv == 0,
                        "{case}: RSV1 on a continuation frame (RFC 7692 6.1)"
                    );
                    let Some((_, _, bytes)) = data.as_mut() else {
                        panic!("{case}: a continuation with no message begun (RFC 6455 5.4)");
                    };
                    bytes.extend_from_slice(&f.payload);
                }
                op => panic!("{case}: the relay sent opcode {op:#x} (RFC 6455 5.2)"),
            }
            if !f.fin {
                continue;
            }
            let Some((opcode, compressed, bytes)) = data.take() else {
                unreachable!()
            };
            self.last_compressed = compressed;
            let bytes = if compressed {
                self.inflate_message(&bytes)
            } else {
                bytes
            };
            return if opcode == TEXT {
                match String::from_utf8(bytes) {
                    Ok(t) => Msg::Text(t),
                    Err(_) => panic!(
                        "{}: a text message that is not UTF-8 (RFC 6455 8.1)",
                        self.case
                    ),
                }
            } else {
                Msg::Binary(bytes)
            };
        }
    }

    /// Inflates a compressed message from the relay (RFC 7692 7.2.2).
    fn inflate_message(&mut self, payload: &[u8]) -> Vec<u8> {
        let pmd = self.deflate.clone().expect("agreed");
        if pmd.server_no_context || self.inflater.is_none() {
            self.inflater = Some(flate2::Decompress::new_with_window_bits(
                false,
                pmd.server_bits,
            ));
        }
        let d = self.inflater.as_mut().expect("made above");
        match inflate(d, payload) {
            Ok((out, ended)) => {
                if ended {
                    // A final block ends the relay's context too.
                    self.inflater = None;
                }
                out
            }
            Err(e) => panic!(
                "{}: the relay's compressed message does not inflate (window {} bits, {}): {e}",
                self.case,
                pmd.server_bits,
                if pmd.server_no_context {
                    "on its own"
                } else {
                    "after the earlier ones"
                }
            ),
        }
    }

    fn expect_text(&mut self) -> String {
        match self.next() {
            Msg::Text(t) => t,
            other => panic!("{}: expected a text message, got {other:?}", self.case),
        }
    }

    fn expect_json(&mut self) -> Value {
        let t = self.expect_text();
        serde_json::from_str(&t).unwrap_or_else(|e| {
            panic!(
                "{}: the relay sent text that is not JSON ({e}): {t}",
                self.case
            )
        })
    }

    /// The next message is a NOTICE; its text.
    fn expect_notice(&mut self) -> String {
        let v = self.expect_json();
        assert_eq!(v[0], "NOTICE", "{}: expected a NOTICE, got {v}", self.case);
        v[1].as_str().unwrap_or_default().to_string()
    }

    /// Reads until `["EOSE",sub]`; only EVENTs of `sub` may come first.
    /// Returns the events' texts.
    fn expect_eose(&mut self, sub: &str) -> Vec<String> {
        let mut events = Vec::new();
        loop {
            let t = self.expect_text();
            let v: Value = serde_json::from_str(&t).unwrap();
            match v[0].as_str() {
                Some("EOSE") if v[1] == sub => return events,
                Some("EVENT") if v[1] == sub => events.push(t),
                _ => panic!("{}: expected the EOSE of {sub:?}, got {t}", self.case),
            }
        }
    }

    fn expect_pong(&mut self, payload: &[u8]) {
        match self.next() {
            Msg::Pong(p) => assert!(
                p == payload,
                "{}: a Pong with another payload than its Ping's (RFC 6455 5.5.3): {:?} for {:?}",
                self.case,
                String::from_utf8_lossy(&p),
                String::from_utf8_lossy(payload)
            ),
            other => panic!("{}: expected a Pong, got {other:?}", self.case),
        }
    }

    /// The connection is open: a Ping now is answered by the next frame.
    fn expect_alive(&mut self) {
        self.send(&ping(b"still there?"));
        self.expect_pong(b"still there?");
    }

    /// The next message is a Close with `code`, then the relay closes the
    /// TCP connection with nothing more sent (RFC 6455 5.5.1, 7.1.1).
    fn expect_close(&mut self, code: u16) {
        match self.next() {
            Msg::Close(got, reason) => assert_eq!(
                got,
                Some(code),
                "{}: the Close's code (reason {reason:?})",
                self.case
            ),
            other => panic!(
                "{}: expected a Close with code {code}, got {other:?}",
                self.case
            ),
        }
        self.expect_gone();
    }

    /// As [`Ws::expect_close`], allowing one NOTICE first (the relay says
    /// why before it closes for a message too large).
    fn expect_close_after_notice(&mut self, code: u16) {
        match self.next() {
            Msg::Text(t) => {
                assert!(
                    t.starts_with("[\"NOTICE\""),
                    "{}: expected a NOTICE or a Close, got {t}",
                    self.case
                );
                self.expect_close(code);
            }
            Msg::Close(got, reason) => {
                assert_eq!(
                    got,
                    Some(code),
                    "{}: the Close's code ({reason:?})",
                    self.case
                );
                self.expect_gone();
            }
            other => panic!(
                "{}: expected a Close with code {code}, got {other:?}",
                self.case
            ),
        }
    }

    /// The relay closed the TCP connection and sent nothing more.
    fn expect_gone(&mut self) {
        match self.next() {
            Msg::Gone => {}
            other => panic!(
                "{}: expected the TCP connection closed, got {other:?}",
                self.case
            ),
        }
    }

    /// Ends the connection as a client should: Close 1000, echoed, then
    /// the relay closes TCP.
    fn close_normally(mut self) {
        self.send(&close(1000, b""));
        self.expect_close(1000);
    }
}

/// Parses a server frame at the start of `buf`, checking what RFC 6455
/// asks of a server's frames; `None` when more bytes are needed.
fn parse_server_frame(case: &str, buf: &[u8]) -> Option<(Frame, usize)> {
    let [b0, b1, ..] = *buf else {
        return None;
    };
    assert!(
        b1 & 0x80 == 0,
        "{case}: the relay masked a frame (RFC 6455 5.1)"
    );
    let (len, at) = match b1 & 0x7f {
        126 => (
            u64::from(u16::from_be_bytes(buf.get(2..4)?.try_into().unwrap())),
            4,
        ),
        127 => (u64::from_be_bytes(buf.get(2..10)?.try_into().unwrap()), 10),
        n => (u64::from(n), 2),
    };
    let opcode = b0 & 0x0f;
    if opcode & 0x8 != 0 {
        assert!(
            b0 & 0x80 != 0 && len <= 125,
            "{case}: a fragmented or long control frame (RFC 6455 5.5)"
        );
    }
    let len = usize::try_from(len).unwrap();
    let payload = buf.get(at..at + len)?.to_vec();
    Some((
        Frame {
            fin: b0 & 0x80 != 0,
            rsv: (b0 >> 4) & 7,
            opcode,
            payload,
        },
        at + len,
    ))
}

fn close_message(case: &str, payload: &[u8]) -> Msg {
    match payload {
        [] => Msg::Close(None, String::new()),
        [_] => panic!("{case}: a Close body of one byte (RFC 6455 5.5.1)"),
        [a, b, reason @ ..] => {
            let reason = std::str::from_utf8(reason).unwrap_or_else(|_| {
                panic!("{case}: a close reason that is not UTF-8 (RFC 6455 5.5.1)")
            });
            Msg::Close(Some(u16::from_be_bytes([*a, *b])), reason.to_string())
        }
    }
}

/// The agreed extension of a 101 answer: permessage-deflate alone.
fn parse_agreed(case: &str, value: &str) -> Pmd {
    let agreed: Vec<&str> = value.split(',').map(str::trim).collect();
    assert_eq!(
        agreed.len(),
        1,
        "{case}: more than one extension agreed: {value}"
    );
    let mut parts = agreed[0].split(';').map(str::trim);
    assert_eq!(
        parts.next(),
        Some("permessage-deflate"),
        "{case}: an extension never offered (RFC 6455 9.1): {value}"
    );
    let params: Vec<(String, Option<String>)> = parts
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (
                k.trim().to_ascii_lowercase(),
                Some(v.trim().trim_matches('"').to_string()),
            ),
            None => (p.to_ascii_lowercase(), None),
        })
        .collect();
    let bits = |name: &str| -> Option<u8> {
        params
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| {
                v.parse()
                    .ok()
                    .filter(|b| (8..=15).contains(b))
                    .unwrap_or_else(|| panic!("{case}: {name}={v} (RFC 7692 7.1.2)"))
            })
    };
    Pmd {
        server_no_context: params
            .iter()
            .any(|(n, _)| n == "server_no_context_takeover"),
        // zlib's raw inflate takes 9 at least; a window of 8 fits in it.
        server_bits: bits("server_max_window_bits").unwrap_or(15).max(9),
        client_bits: bits("client_max_window_bits").unwrap_or(15).max(9),
        params,
    }
}

/// Inflates one message's payload with `d` (the trailer 00 00 ff ff put
/// back, RFC 7692 7.2.2); also whether the stream ended (a final block).
fn inflate(
    d: &mut flate2::Decompress,
    payload: &[u8],
) -> Result<(Vec<u8>, bool), flate2::DecompressError> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0x00, 0x00, 0xff, 0xff]);
    let mut out = Vec::with_capacity(payload.len() * 4 + 256);
    let start = d.total_in();
    loop {
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.capacity().max(1024));
        }
        let done = (d.total_in() - start) as usize;
        let status = d.decompress_vec(&input[done..], &mut out, flate2::FlushDecompress::Sync)?;
        if status == flate2::Status::StreamEnd {
            return Ok((out, true));
        }
        let consumed = (d.total_in() - start) as usize == input.len();
        if consumed && out.len() < out.capacity() {
            return Ok((out, false));
        }
    }
}

// ============================================================ the cases

/// Autobahn 1.1.x (RFC 6455 5.6): a text message of `len` bytes, sent in
/// one frame (in writes of `chop` bytes when given), is answered.
fn text_of_len(case: &str, len: usize, chop: Option<usize>) {
    let mut ws = Ws::open(&core(), case);
    let message = if len == 0 { Vec::new() } else { req("s", len) };
    let f = text(&message);
    match chop {
        Some(n) => ws.send_chopped(&f, n),
        None => ws.send(&f),
    }
    if len == 0 {
        // Not JSON: a NOTICE.
        ws.expect_notice();
    } else {
        ws.expect_eose("s");
    }
    ws.close_normally();
}

/// Autobahn 1.2.x (RFC 6455 5.6): a binary message of `len` bytes is
/// answered (with a NOTICE: a Nostr relay takes text).
fn binary_of_len(case: &str, len: usize, chop: Option<usize>) {
    let mut ws = Ws::open(&core(), case);
    let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let f = binary(&payload);
    match chop {
        Some(n) => ws.send_chopped(&f, n),
        None => ws.send(&f),
    }
    let notice = ws.expect_notice();
    assert!(notice.contains("binary"), "{case}: {notice}");
    ws.close_normally();
}

#[test]
fn ab_1_1_1_text_of_0_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.1, RFC 6455 5.6: text of 0 bytes answered",
        0,
        None,
    );
}

#[test]
fn ab_1_1_2_text_of_125_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.2, RFC 6455 5.2: text of 125 bytes (7-bit length) answered",
        125,
        None,
    );
}

#[test]
fn ab_1_1_3_text_of_126_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.3, RFC 6455 5.2: text of 126 bytes (16-bit length) answered",
        126,
        None,
    );
}

#[test]
fn ab_1_1_4_text_of_127_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.4, RFC 6455 5.2: text of 127 bytes answered",
        127,
        None,
    );
}

#[test]
fn ab_1_1_5_text_of_128_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.5, RFC 6455 5.2: text of 128 bytes answered",
        128,
        None,
    );
}

#[test]
fn ab_1_1_6_text_of_65535_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.6, RFC 6455 5.2: text of 65535 bytes (16-bit length) answered",
        65_535,
        None,
    );
}

#[test]
fn ab_1_1_7_text_of_65536_bytes_is_answered() {
    text_of_len(
        "Autobahn 1.1.7, RFC 6455 5.2: text of 65536 bytes (64-bit length) answered",
        65_536,
        None,
    );
}

#[test]
fn ab_1_1_8_text_of_65536_bytes_in_chops_of_997_is_answered() {
    text_of_len(
        "Autobahn 1.1.8, RFC 6455 5.2: text of 65536 bytes written in chops of 997 answered",
        65_536,
        Some(997),
    );
}

#[test]
fn ab_1_2_1_binary_of_0_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.1, RFC 6455 5.6: binary of 0 bytes answered (NOTICE)",
        0,
        None,
    );
}

#[test]
fn ab_1_2_2_binary_of_125_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.2, RFC 6455 5.2: binary of 125 bytes answered (NOTICE)",
        125,
        None,
    );
}

#[test]
fn ab_1_2_3_binary_of_126_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.3, RFC 6455 5.2: binary of 126 bytes answered (NOTICE)",
        126,
        None,
    );
}

#[test]
fn ab_1_2_4_binary_of_127_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.4, RFC 6455 5.2: binary of 127 bytes answered (NOTICE)",
        127,
        None,
    );
}

#[test]
fn ab_1_2_5_binary_of_128_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.5, RFC 6455 5.2: binary of 128 bytes answered (NOTICE)",
        128,
        None,
    );
}

#[test]
fn ab_1_2_6_binary_of_65535_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.6, RFC 6455 5.2: binary of 65535 bytes answered (NOTICE)",
        65_535,
        None,
    );
}

#[test]
fn ab_1_2_7_binary_of_65536_bytes_is_answered() {
    binary_of_len(
        "Autobahn 1.2.7, RFC 6455 5.2: binary of 65536 bytes answered (NOTICE)",
        65_536,
        None,
    );
}

#[test]
fn ab_1_2_8_binary_of_65536_bytes_in_chops_of_997_is_answered() {
    binary_of_len(
        "Autobahn 1.2.8, RFC 6455 5.2: binary of 65536 bytes in chops of 997 answered (NOTICE)",
        65_536,
        Some(997),
    );
}

#[test]
fn rfc_5_1_an_unmasked_client_frame_fails_with_1002() {
    let case = "RFC 6455 5.1: an unmasked client frame fails the connection, Close 1002";
    let mut ws = Ws::open(&core(), case);
    let message = short_req("s");
    let mut f = vec![0x80 | TEXT];
    push_len(&mut f, 0, message.len() as u64);
    f.extend_from_slice(&message);
    ws.send(&f);
    ws.expect_close(1002);
}

#[test]
fn rfc_5_2_a_64_bit_length_with_its_top_bit_set_fails_with_1002() {
    let case =
        "RFC 6455 5.2: a 64-bit payload length with its most significant bit set fails, Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&header_only(true, TEXT, 1 << 63));
    ws.expect_close(1002);
}

#[test]
fn rfc_5_2_a_length_not_in_its_shortest_form_is_read() {
    // The shortest form is the sender's duty; a receiver that reads the
    // length as written interoperates (Autobahn does not test it).
    let case = "RFC 6455 5.2: a 20-byte text with a 64-bit length field is read (lenient)";
    let mut ws = Ws::open(&core(), case);
    let message = short_req("s");
    let mut f = vec![0x80 | TEXT, 0x80 | 127];
    f.extend_from_slice(&(message.len() as u64).to_be_bytes());
    let mask = next_mask();
    f.extend_from_slice(&mask);
    f.extend(message.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    ws.send(&f);
    ws.expect_eose("s");
    ws.close_normally();
}

// ---------------------------------------------------------- 2: ping/pong

fn ping_is_answered(case: &str, payload: &[u8], chop: Option<usize>) {
    let mut ws = Ws::open(&core(), case);
    let f = ping(payload);
    match chop {
        Some(n) => ws.send_chopped(&f, n),
        None => ws.send(&f),
    }
    ws.expect_pong(payload);
    ws.close_normally();
}

#[test]
fn ab_2_1_ping_without_payload_gets_a_pong() {
    ping_is_answered(
        "Autobahn 2.1, RFC 6455 5.5.2: Ping with no payload gets a Pong",
        b"",
        None,
    );
}

#[test]
fn ab_2_2_ping_with_text_payload_gets_it_back() {
    ping_is_answered(
        "Autobahn 2.2, RFC 6455 5.5.3: Ping's text payload echoed in the Pong",
        b"Hello, world!",
        None,
    );
}

#[test]
fn ab_2_3_ping_with_binary_payload_gets_it_back() {
    ping_is_answered(
        "Autobahn 2.3, RFC 6455 5.5.3: Ping's binary payload echoed in the Pong",
        &[0x00, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0x00, 0xff],
        None,
    );
}

#[test]
fn ab_2_4_ping_of_125_bytes_gets_them_back() {
    ping_is_answered(
        "Autobahn 2.4, RFC 6455 5.5: Ping of 125 bytes (the most) echoed",
        &[0xfe; 125],
        None,
    );
}

#[test]
fn ab_2_5_ping_of_126_bytes_fails_with_1002() {
    let case = "Autobahn 2.5, RFC 6455 5.5: Ping of 126 bytes fails the connection, Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&ping(&[0xfe; 126]));
    ws.expect_close(1002);
}

#[test]
fn ab_2_6_ping_of_125_bytes_in_chops_of_1_gets_them_back() {
    ping_is_answered(
        "Autobahn 2.6, RFC 6455 5.5: Ping of 125 bytes written 1 byte at a time echoed",
        &[0xfe; 125],
        Some(1),
    );
}

#[test]
fn ab_2_7_an_unsolicited_empty_pong_is_ignored() {
    let case =
        "Autobahn 2.7, RFC 6455 5.5.3: unsolicited Pong (empty) ignored, the next Ping answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[pong(b""), ping(b"after")].concat());
    ws.expect_pong(b"after");
    ws.close_normally();
}

#[test]
fn ab_2_8_an_unsolicited_pong_with_payload_is_ignored() {
    let case = "Autobahn 2.8, RFC 6455 5.5.3: unsolicited Pong with payload ignored";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[pong(b"unsolicited pong payload"), ping(b"after")].concat());
    ws.expect_pong(b"after");
    ws.close_normally();
}

#[test]
fn ab_2_9_a_pong_before_its_ping_is_ignored() {
    let case = "Autobahn 2.9, RFC 6455 5.5.3: Pong then Ping of the same payload: one Pong back";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[pong(b"ping payload"), ping(b"ping payload")].concat());
    ws.expect_pong(b"ping payload");
    ws.expect_alive();
    ws.close_normally();
}

fn ten_pings(case: &str, chop: Option<usize>) {
    let mut ws = Ws::open(&core(), case);
    let pings: Vec<u8> = (0..10)
        .flat_map(|i| ping(format!("payload-{i}").as_bytes()))
        .collect();
    match chop {
        Some(n) => ws.send_chopped(&pings, n),
        None => ws.send(&pings),
    }
    for i in 0..10 {
        ws.expect_pong(format!("payload-{i}").as_bytes());
    }
    ws.close_normally();
}

#[test]
fn ab_2_10_ten_pings_get_ten_pongs_in_order() {
    // RFC 6455 5.5.3 allows answering only the latest Ping; the relay
    // answers each, which is what is checked.
    ten_pings(
        "Autobahn 2.10, RFC 6455 5.5.3: 10 Pings get 10 Pongs in order",
        None,
    );
}

#[test]
fn ab_2_11_ten_pings_in_chops_of_1_get_ten_pongs_in_order() {
    ten_pings(
        "Autobahn 2.11, RFC 6455 5.5.3: 10 Pings written 1 byte at a time get 10 Pongs",
        Some(1),
    );
}

// ------------------------------------------------------ 3: reserved bits

/// A valid text the relay answers before it reads the next frame (a
/// NOTICE: it is not JSON). A REQ's EOSE comes from the query path, after
/// the frames behind it may have been read: a protocol error in them fails
/// the connection first, and the EOSE is never sent.
fn sync_text() -> Vec<u8> {
    text(b"not json")
}

/// RFC 6455 5.2: a reserved bit set with no extension agreed fails the
/// connection (Close 1002). A valid text `before` (when true) is answered
/// first; `after` frames, sent with the bad one, are never answered.
fn reserved(case: &str, before: bool, separate: bool, bad: Vec<u8>, after: &[Vec<u8>]) {
    let mut ws = Ws::open(&core(), case);
    let mut tail = bad;
    for f in after {
        tail.extend_from_slice(f);
    }
    match (before, separate) {
        (true, true) => {
            ws.send(&sync_text());
            ws.expect_notice();
            ws.send(&tail);
        }
        (true, false) => {
            ws.send(&[sync_text(), tail].concat());
            ws.expect_notice();
        }
        (false, _) => ws.send(&tail),
    }
    ws.expect_close(1002);
}

#[test]
fn ab_3_1_text_with_rsv3_fails_with_1002() {
    reserved(
        "Autobahn 3.1, RFC 6455 5.2: text with RSV3 fails, Close 1002",
        false,
        false,
        frame(true, RSV3, TEXT, &short_req("s")),
        &[],
    );
}

#[test]
fn ab_3_2_text_with_rsv2_after_a_valid_one_fails_with_1002() {
    reserved(
        "Autobahn 3.2, RFC 6455 5.2: text, then text with RSV2, then Ping: first answered, then Close 1002, no Pong",
        true,
        false,
        frame(true, RSV2, TEXT, &short_req("t")),
        &[ping(b"")],
    );
}

#[test]
fn ab_3_3_text_with_rsv2_and_rsv3_frame_by_frame_fails_with_1002() {
    reserved(
        "Autobahn 3.3, RFC 6455 5.2: text, then (another write) text with RSV2+RSV3, Ping: answered, Close 1002",
        true,
        true,
        frame(true, RSV2 | RSV3, TEXT, &short_req("t")),
        &[ping(b"")],
    );
}

#[test]
fn ab_3_4_text_with_rsv1_fails_with_1002() {
    reserved(
        "Autobahn 3.4, RFC 6455 5.2: text, then text with RSV1 (no extension agreed), Ping: answered, Close 1002",
        true,
        true,
        frame(true, RSV1, TEXT, &short_req("t")),
        &[ping(b"")],
    );
}

#[test]
fn ab_3_5_binary_with_rsv1_and_rsv3_fails_with_1002() {
    reserved(
        "Autobahn 3.5, RFC 6455 5.2: binary with RSV1+RSV3 fails, Close 1002",
        false,
        false,
        frame(true, RSV1 | RSV3, BINARY, &[0xff; 8]),
        &[],
    );
}

#[test]
fn ab_3_6_ping_with_rsv1_and_rsv2_fails_with_1002() {
    reserved(
        "Autobahn 3.6, RFC 6455 5.2: Ping with RSV1+RSV2 fails, no Pong, Close 1002",
        false,
        false,
        frame(true, RSV1 | RSV2, PING, b"ping"),
        &[],
    );
}

#[test]
fn ab_3_7_close_with_all_reserved_bits_fails_with_1002() {
    reserved(
        "Autobahn 3.7, RFC 6455 5.2: Close with RSV1+RSV2+RSV3 fails, Close 1002 (not an echo of 1000)",
        false,
        false,
        frame(true, RSV1 | RSV2 | RSV3, CLOSE, &close_body(1000, b"")),
        &[],
    );
}

// --------------------------------------------------- 4: reserved opcodes

/// RFC 6455 5.2: an opcode that is reserved fails the connection (Close
/// 1002). With `before`, a valid text is answered first; a Ping sent after
/// the bad frame is never answered.
fn reserved_opcode(case: &str, opcode: u8, payload: &[u8], before: bool) {
    let mut ws = Ws::open(&core(), case);
    let bad = frame(true, 0, opcode, payload);
    if before {
        ws.send(&[sync_text(), bad, ping(b"")].concat());
        ws.expect_notice();
    } else {
        ws.send(&bad);
    }
    ws.expect_close(1002);
}

#[test]
fn ab_4_1_1_opcode_3_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.1.1, RFC 6455 5.2: reserved data opcode 3 fails, Close 1002",
        3,
        b"",
        false,
    );
}

#[test]
fn ab_4_1_2_opcode_4_with_payload_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.1.2, RFC 6455 5.2: reserved data opcode 4 with payload fails, Close 1002",
        4,
        b"reserved opcode payload",
        false,
    );
}

#[test]
fn ab_4_1_3_opcode_5_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.1.3, RFC 6455 5.2: text, opcode 5, Ping: answered, Close 1002, no Pong",
        5,
        b"",
        true,
    );
}

#[test]
fn ab_4_1_4_opcode_6_with_payload_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.1.4, RFC 6455 5.2: text, opcode 6 with payload, Ping: answered, Close 1002",
        6,
        b"reserved opcode payload",
        true,
    );
}

#[test]
fn ab_4_1_5_opcode_7_with_payload_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.1.5, RFC 6455 5.2: text, opcode 7 with payload, Ping: answered, Close 1002",
        7,
        b"reserved opcode payload",
        true,
    );
}

#[test]
fn ab_4_2_1_opcode_11_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.2.1, RFC 6455 5.2: reserved control opcode 0xB fails, Close 1002",
        0xB,
        b"",
        false,
    );
}

#[test]
fn ab_4_2_2_opcode_12_with_payload_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.2.2, RFC 6455 5.2: reserved control opcode 0xC with payload fails, Close 1002",
        0xC,
        b"reserved opcode payload",
        false,
    );
}

#[test]
fn ab_4_2_3_opcode_13_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.2.3, RFC 6455 5.2: text, opcode 0xD, Ping: answered, Close 1002, no Pong",
        0xD,
        b"",
        true,
    );
}

#[test]
fn ab_4_2_4_opcode_14_with_payload_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.2.4, RFC 6455 5.2: text, opcode 0xE with payload, Ping: answered, Close 1002",
        0xE,
        b"reserved opcode payload",
        true,
    );
}

#[test]
fn ab_4_2_5_opcode_15_with_payload_after_a_text_fails_with_1002() {
    reserved_opcode(
        "Autobahn 4.2.5, RFC 6455 5.2: text, opcode 0xF with payload, Ping: answered, Close 1002",
        0xF,
        b"reserved opcode payload",
        true,
    );
}

// --------------------------------------------------- 5: fragmentation

#[test]
fn ab_5_1_a_fragmented_ping_fails_with_1002() {
    let case = "Autobahn 5.1, RFC 6455 5.4/5.5: Ping in 2 fragments fails, Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[frame(false, 0, PING, b"frag"), cont(true, b"ment")].concat());
    ws.expect_close(1002);
}

#[test]
fn ab_5_2_a_fragmented_pong_fails_with_1002() {
    let case = "Autobahn 5.2, RFC 6455 5.4/5.5: Pong in 2 fragments fails, Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[frame(false, 0, PONG, b"frag"), cont(true, b"ment")].concat());
    ws.expect_close(1002);
}

/// A REQ of `len` bytes in fragments of `size`, written as `how` says,
/// with a Ping after each fragment `pings_after` names (by index), all
/// answered in order: the Pongs (sent as each Ping is read), then the EOSE.
fn fragments_answered(case: &str, len: usize, size: usize, pings_after: &[usize], how: How) {
    let mut ws = Ws::open(&core(), case);
    let mut frames = Vec::new();
    for (i, f) in fragmented(TEXT, &req("s", len), size)
        .into_iter()
        .enumerate()
    {
        frames.push(f);
        if pings_after.contains(&i) {
            frames.push(ping(format!("between {i}").as_bytes()));
        }
    }
    match how {
        How::Together => ws.send(&frames.concat()),
        How::FrameByFrame => ws.send_frames(&frames),
        How::Chops(n) => ws.send_chopped(&frames.concat(), n),
    }
    for i in pings_after {
        ws.expect_pong(format!("between {i}").as_bytes());
    }
    ws.expect_eose("s");
    ws.close_normally();
}

#[derive(Clone, Copy)]
enum How {
    /// All frames in one write.
    Together,
    /// One write per frame.
    FrameByFrame,
    /// Writes of this many bytes.
    Chops(usize),
}

#[test]
fn ab_5_3_text_in_2_fragments_is_assembled() {
    fragments_answered(
        "Autobahn 5.3, RFC 6455 5.4: text in 2 fragments assembled and answered",
        40,
        20,
        &[],
        How::Together,
    );
}

#[test]
fn ab_5_4_text_in_2_fragments_frame_by_frame_is_assembled() {
    fragments_answered(
        "Autobahn 5.4, RFC 6455 5.4: text in 2 fragments, one write each, assembled",
        40,
        20,
        &[],
        How::FrameByFrame,
    );
}

#[test]
fn ab_5_5_text_in_2_fragments_in_chops_of_1_is_assembled() {
    fragments_answered(
        "Autobahn 5.5, RFC 6455 5.4: text in 2 fragments written 1 byte at a time, assembled",
        40,
        20,
        &[],
        How::Chops(1),
    );
}

#[test]
fn ab_5_6_text_in_2_fragments_with_a_ping_between_is_assembled() {
    fragments_answered(
        "Autobahn 5.6, RFC 6455 5.4: text in 2 fragments with a Ping between: Pong, then answer",
        40,
        20,
        &[0],
        How::Together,
    );
}

#[test]
fn ab_5_7_text_in_2_fragments_with_a_ping_between_frame_by_frame() {
    fragments_answered(
        "Autobahn 5.7, RFC 6455 5.4: as 5.6, one write per frame",
        40,
        20,
        &[0],
        How::FrameByFrame,
    );
}

#[test]
fn ab_5_8_text_in_2_fragments_with_a_ping_between_in_chops_of_1() {
    fragments_answered(
        "Autobahn 5.8, RFC 6455 5.4: as 5.6, written 1 byte at a time",
        40,
        20,
        &[0],
        How::Chops(1),
    );
}

/// A connection failed with 1002 by the first of `frames`, written as
/// `how` says; nothing is answered.
fn fails_at_once(case: &str, frames: &[Vec<u8>], how: How) {
    let mut ws = Ws::open(&core(), case);
    match how {
        How::Together => ws.send(&frames.concat()),
        How::FrameByFrame => ws.send_frames(frames),
        How::Chops(n) => ws.send_chopped(&frames.concat(), n),
    }
    ws.expect_close(1002);
}

/// Autobahn 5.9 to 5.14: a continuation (FIN or not) with nothing to
/// continue, then a whole text.
fn orphan_continuation(fin: bool) -> Vec<Vec<u8>> {
    vec![cont(fin, b"non-continuation payload"), sync_text()]
}

#[test]
fn ab_5_9_a_final_continuation_with_nothing_begun_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.9, RFC 6455 5.4: continuation (FIN) with nothing to continue, then a text, one write: Close 1002, no answer",
        &orphan_continuation(true),
        How::Together,
    );
}

#[test]
fn ab_5_10_a_final_continuation_with_nothing_begun_frame_by_frame_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.10, RFC 6455 5.4: as 5.9, one write per frame: Close 1002, no answer",
        &orphan_continuation(true),
        How::FrameByFrame,
    );
}

#[test]
fn ab_5_11_a_final_continuation_with_nothing_begun_in_chops_of_1_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.11, RFC 6455 5.4: as 5.9, written 1 byte at a time: Close 1002, no answer",
        &orphan_continuation(true),
        How::Chops(1),
    );
}

#[test]
fn ab_5_12_a_continuation_with_nothing_begun_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.12, RFC 6455 5.4: continuation (not FIN) with nothing to continue, then a text: Close 1002, no answer",
        &orphan_continuation(false),
        How::Together,
    );
}

#[test]
fn ab_5_13_a_continuation_with_nothing_begun_frame_by_frame_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.13, RFC 6455 5.4: as 5.12, one write per frame: Close 1002, no answer",
        &orphan_continuation(false),
        How::FrameByFrame,
    );
}

#[test]
fn ab_5_14_a_continuation_with_nothing_begun_in_chops_of_1_fails_with_1002() {
    fails_at_once(
        "Autobahn 5.14, RFC 6455 5.4: as 5.12, written 1 byte at a time: Close 1002, no answer",
        &orphan_continuation(false),
        How::Chops(1),
    );
}

#[test]
fn ab_5_15_a_continuation_after_a_whole_fragmented_message_fails_with_1002() {
    let case = "Autobahn 5.15, RFC 6455 5.4: text in 2 fragments (answered), continuation with nothing begun, text: Close 1002";
    let mut ws = Ws::open(&core(), case);
    let mut frames = fragmented(TEXT, b"not json, in 2 fragments", 12);
    frames.push(cont(false, b"fragment3"));
    frames.push(text(&short_req("t")));
    ws.send(&frames.concat());
    ws.expect_notice();
    ws.expect_close(1002);
}

#[test]
fn ab_5_16_continuation_first_then_a_fragmented_text_twice_fails_with_1002() {
    let three = [
        cont(false, b"fragment1"),
        text_first(b"fragment2"),
        cont(true, b"fragment3"),
    ];
    fails_at_once(
        "Autobahn 5.16, RFC 6455 5.4: twice (continuation not FIN, text not FIN, continuation FIN): Close 1002 at the first frame",
        &[three.clone(), three].concat(),
        How::Together,
    );
}

#[test]
fn ab_5_17_final_continuation_first_then_a_fragmented_text_twice_fails_with_1002() {
    let three = [
        cont(true, b"fragment1"),
        text_first(b"fragment2"),
        cont(true, b"fragment3"),
    ];
    fails_at_once(
        "Autobahn 5.17, RFC 6455 5.4: twice (continuation FIN, text not FIN, continuation FIN): Close 1002 at the first frame",
        &[three.clone(), three].concat(),
        How::Together,
    );
}

#[test]
fn rfc_5_4_a_new_text_while_a_fragmented_one_is_open_fails_with_1002() {
    fails_at_once(
        "RFC 6455 5.4: a text frame (not FIN) while a fragmented text is open: Close 1002",
        &[
            text_first(b"[\"REQ\","),
            text_first(b"\"s\","),
            cont(true, b"{}]"),
        ],
        How::Together,
    );
}

#[test]
fn rfc_5_4_a_binary_while_a_fragmented_text_is_open_fails_with_1002() {
    fails_at_once(
        "RFC 6455 5.4: a whole binary message while a fragmented text is open: Close 1002",
        &[
            text_first(b"[\"REQ\","),
            binary(b"in the middle"),
            cont(true, b"\"s\",{}]"),
        ],
        How::Together,
    );
}

#[test]
fn ab_5_18_a_text_in_2_fragments_both_with_opcode_text_fails_with_1002() {
    let case =
        "Autobahn 5.18, RFC 6455 5.4: text in 2 fragments, both with opcode text: Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[text_first(b"[\"REQ\",\"s\","), text(b"{\"limit\":0}]")].concat());
    ws.expect_close(1002);
}

#[test]
fn ab_5_19_text_in_5_fragments_with_2_pings_between_is_assembled() {
    fragments_answered(
        "Autobahn 5.19, RFC 6455 5.4: text in 5 fragments, Pings after the 2nd and 4th: 2 Pongs, then answer",
        50,
        10,
        &[1, 3],
        How::FrameByFrame,
    );
}

#[test]
fn ab_5_20_text_in_5_fragments_with_2_pings_between_in_chops_of_1() {
    fragments_answered(
        "Autobahn 5.20, RFC 6455 5.4: as 5.19, written 1 byte at a time",
        50,
        10,
        &[1, 3],
        How::Chops(1),
    );
}

#[test]
fn rfc_5_4_a_close_between_fragments_is_echoed() {
    let case = "RFC 6455 5.4/5.5.1: a Close between the fragments of a text is echoed (1000), the text never answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(
        &[
            text_first(b"[\"REQ\","),
            close(1000, b""),
            cont(true, b"\"s\",{}]"),
        ]
        .concat(),
    );
    ws.expect_close(1000);
}

#[test]
fn rfc_5_4_binary_in_fragments_is_assembled() {
    let case = "RFC 6455 5.4: binary in 3 fragments assembled and answered (NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send_frames(&fragmented(BINARY, &[7u8; 300], 100));
    let notice = ws.expect_notice();
    assert!(notice.contains("binary"), "{case}: {notice}");
    ws.close_normally();
}

// ------------------------------------------------------------- 6: UTF-8

#[test]
fn ab_6_1_1_an_empty_text_is_answered() {
    let case = "Autobahn 6.1.1, RFC 6455 5.6: an empty text is valid UTF-8, answered (NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&text(b""));
    ws.expect_notice();
    ws.close_normally();
}

#[test]
fn ab_6_1_2_an_empty_text_in_3_empty_fragments_is_answered() {
    let case = "Autobahn 6.1.2, RFC 6455 5.4: an empty text in 3 empty fragments answered (NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[text_first(b""), cont(false, b""), cont(true, b"")].concat());
    ws.expect_notice();
    ws.close_normally();
}

#[test]
fn ab_6_1_3_empty_fragments_around_a_text_are_assembled() {
    let case =
        "Autobahn 6.1.3, RFC 6455 5.4: empty fragment, the text, empty final fragment: answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(
        &[
            text_first(b""),
            cont(false, &short_req("s")),
            cont(true, b""),
        ]
        .concat(),
    );
    ws.expect_eose("s");
    ws.close_normally();
}

const HELLO_UTF8: &str = "Hello-\u{b5}@\u{df}\u{f6}\u{e4}\u{fc}\u{e0}\u{e1}-UTF-8!!";
const KOSME: &str = "\u{3ba}\u{1f79}\u{3c3}\u{3bc}\u{3b5}";

/// A REQ holding `value`, cut into frames as `cut` says (a write per
/// frame), is answered.
fn utf8_answered(case: &str, value: &[u8], cut: Cut) {
    let mut ws = Ws::open(&core(), case);
    let message = tag_req("s", value);
    ws.send_frames(&cut.frames(&message));
    ws.expect_eose("s");
    ws.close_normally();
}

/// A text holding `value` (not UTF-8), cut as `cut` says and written at
/// once, fails the connection with 1007.
fn utf8_fails(case: &str, value: &[u8], cut: Cut) {
    let mut ws = Ws::open(&core(), case);
    let message = tag_req("s", value);
    ws.send(&cut.frames(&message).concat());
    ws.expect_close(1007);
}

/// How a text message is cut into frames.
#[derive(Clone, Copy)]
enum Cut {
    /// One frame.
    Whole,
    /// A frame per byte.
    EveryByte,
    /// A frame per `n` bytes.
    Every(usize),
}

impl Cut {
    fn frames(self, message: &[u8]) -> Vec<Vec<u8>> {
        match self {
            Cut::Whole => vec![text(message)],
            Cut::EveryByte => fragmented(TEXT, message, 1),
            Cut::Every(n) => fragmented(TEXT, message, n),
        }
    }
}

#[test]
fn ab_6_2_1_valid_utf8_in_one_frame_is_answered() {
    utf8_answered(
        "Autobahn 6.2.1, RFC 6455 8.1: valid multi-byte UTF-8 in one frame answered",
        HELLO_UTF8.as_bytes(),
        Cut::Whole,
    );
}

#[test]
fn ab_6_2_2_valid_utf8_in_fragments_is_answered() {
    utf8_answered(
        "Autobahn 6.2.2, RFC 6455 5.6: valid UTF-8 in fragments of 7 bytes (code points split) answered",
        HELLO_UTF8.as_bytes(),
        Cut::Every(7),
    );
}

#[test]
fn ab_6_2_3_valid_utf8_fragmented_at_every_byte_is_answered() {
    utf8_answered(
        "Autobahn 6.2.3, RFC 6455 5.6: valid UTF-8 in 1-byte fragments (every code point split) answered",
        HELLO_UTF8.as_bytes(),
        Cut::EveryByte,
    );
}

#[test]
fn ab_6_2_4_kosme_fragmented_at_every_byte_is_answered() {
    utf8_answered(
        "Autobahn 6.2.4, RFC 6455 5.6: \"\u{3ba}\u{1f79}\u{3c3}\u{3bc}\u{3b5}\" in 1-byte fragments answered",
        KOSME.as_bytes(),
        Cut::EveryByte,
    );
}

#[test]
fn ab_6_2_code_points_split_between_two_fragments_are_valid() {
    // A 4-byte code point split 1|3, 2|2, 3|1 between two fragments: each
    // fragment alone is not UTF-8, the message is.
    let emoji = "\u{1f600}".as_bytes();
    for split in 1..4 {
        let case = format!(
            "Autobahn 6.2, RFC 6455 5.6: U+1F600 split {split}|{} between 2 fragments is valid, answered",
            4 - split
        );
        let mut ws = Ws::open(&core(), &case);
        let message = tag_req("s", emoji);
        let at = message.len() - 4 - 4 + split; // the emoji, before `"]}]`
        ws.send(&[text_first(&message[..at]), cont(true, &message[at..])].concat());
        ws.expect_eose("s");
        ws.close_normally();
    }
}

const INVALID_KOSME: &[u8] = b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited";

#[test]
fn ab_6_3_1_invalid_utf8_in_one_frame_fails_with_1007() {
    utf8_fails(
        "Autobahn 6.3.1, RFC 6455 8.1: text with a UTF-16 surrogate (invalid UTF-8) fails, Close 1007",
        INVALID_KOSME,
        Cut::Whole,
    );
}

#[test]
fn ab_6_3_2_invalid_utf8_fragmented_at_every_byte_fails_with_1007() {
    utf8_fails(
        "Autobahn 6.3.2, RFC 6455 8.1: as 6.3.1 in 1-byte fragments, Close 1007",
        INVALID_KOSME,
        Cut::EveryByte,
    );
}

#[test]
fn ab_6_4_1_invalid_utf8_in_the_first_fragment_fails_with_1007() {
    // Autobahn's 6.4.x wait between fragments to see the connection fail
    // as soon as the invalid bytes arrive ("fail fast"); the relay checks a
    // message once it is whole, which Autobahn grades non-strict. Here the
    // last fragment follows at once, and 1007 is expected after it.
    let case = "Autobahn 6.4.1, RFC 6455 8.1: invalid UTF-8 in the 1st of 2 fragments (sent apart): Close 1007 (at the message's end)";
    let mut ws = Ws::open(&core(), case);
    let mut first = tag_req(
        "s",
        b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xf4\x90\x80\x80",
    );
    let rest = first.split_off(first.len() - 4);
    ws.send(&text_first(&first));
    ws.send(&cont(true, &rest));
    ws.expect_close(1007);
}

#[test]
fn ab_6_4_2_invalid_utf8_split_between_fragments_fails_with_1007() {
    let case = "Autobahn 6.4.2, RFC 6455 8.1: a code point above U+10FFFF split between 2 fragments: Close 1007";
    let mut ws = Ws::open(&core(), case);
    let message = tag_req(
        "s",
        b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xf4\x90\x80\x80",
    );
    let at = message.len() - 4 - 2; // between \xf4\x90 and \x80\x80
    ws.send(&text_first(&message[..at]));
    ws.send(&cont(true, &message[at..]));
    ws.expect_close(1007);
}

#[test]
fn ab_6_4_3_an_overlong_sequence_split_between_fragments_fails_with_1007() {
    let case = "Autobahn 6.4.3, RFC 6455 8.1: an overlong '/' (C0 AF) split between 2 fragments: Close 1007";
    let mut ws = Ws::open(&core(), case);
    let message = tag_req("s", b"ab\xc0\xafcd");
    let at = message.len() - 4 - 3; // between \xc0 and \xaf
    ws.send(&[text_first(&message[..at]), cont(true, &message[at..])].concat());
    ws.expect_close(1007);
}

/// Autobahn 6.5 to 6.23: UTF-8 sequences, (case, bytes, valid).
const UTF8_SEQUENCES: &[(&str, &[u8], bool)] = &[
    (
        "6.5.1 kosme",
        b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5",
        true,
    ),
    ("6.6.1 kosme cut after 1 byte", b"\xce", false),
    ("6.6.2 kosme cut after 2 bytes", b"\xce\xba", true),
    ("6.6.3 kosme cut after 3 bytes", b"\xce\xba\xe1", false),
    ("6.6.4 kosme cut after 4 bytes", b"\xce\xba\xe1\xbd", false),
    (
        "6.6.5 kosme cut after 5 bytes",
        b"\xce\xba\xe1\xbd\xb9",
        true,
    ),
    ("6.7.2 U+0080, first of 2 bytes", b"\xc2\x80", true),
    ("6.7.3 U+0800, first of 3 bytes", b"\xe0\xa0\x80", true),
    ("6.7.4 U+10000, first of 4 bytes", b"\xf0\x90\x80\x80", true),
    (
        "6.8.1 first 5-byte sequence",
        b"\xf8\x88\x80\x80\x80",
        false,
    ),
    (
        "6.8.2 first 6-byte sequence",
        b"\xfc\x84\x80\x80\x80\x80",
        false,
    ),
    ("6.9.1 U+007F, last of 1 byte", b"\x7f", true),
    ("6.9.2 U+07FF, last of 2 bytes", b"\xdf\xbf", true),
    ("6.9.3 U+FFFF, last of 3 bytes", b"\xef\xbf\xbf", true),
    (
        "6.9.4 U+10FFFF, the last code point",
        b"\xf4\x8f\xbf\xbf",
        true,
    ),
    (
        "6.10.1 U+1FFFFF, last 4-byte form",
        b"\xf7\xbf\xbf\xbf",
        false,
    ),
    (
        "6.10.2 last 5-byte sequence",
        b"\xfb\xbf\xbf\xbf\xbf",
        false,
    ),
    (
        "6.10.3 last 6-byte sequence",
        b"\xfd\xbf\xbf\xbf\xbf\xbf",
        false,
    ),
    ("6.11.1 U+D7FF", b"\xed\x9f\xbf", true),
    ("6.11.2 U+E000", b"\xee\x80\x80", true),
    ("6.11.3 U+FFFD", b"\xef\xbf\xbd", true),
    ("6.11.4 U+10FFFF", b"\xf4\x8f\xbf\xbf", true),
    ("6.11.5 U+110000", b"\xf4\x90\x80\x80", false),
    ("6.12.1 lone continuation 80", b"\x80", false),
    ("6.12.2 lone continuation BF", b"\xbf", false),
    ("6.12.3 two continuations", b"\x80\xbf", false),
    ("6.12.4 three continuations", b"\x80\xbf\x80", false),
    (
        "6.12.8 all 64 continuation bytes",
        &[
            0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x8b, 0x8c, 0x8d,
            0x8e, 0x8f, 0x90, 0x91, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0x9b,
            0x9c, 0x9d, 0x9e, 0x9f, 0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9,
            0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
            0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf,
        ],
        false,
    ),
    (
        "6.13.1 2-byte leads each followed by a space",
        b"\xc0 \xc1 \xc2 \xdf ",
        false,
    ),
    (
        "6.13.2 3-byte leads each followed by a space",
        b"\xe0 \xe1 \xef ",
        false,
    ),
    (
        "6.13.3 4-byte leads each followed by a space",
        b"\xf0 \xf4 \xf7 ",
        false,
    ),
    ("6.14.1 C0 missing its last byte", b"\xc0", false),
    ("6.14.2 E0 80 missing its last byte", b"\xe0\x80", false),
    (
        "6.14.3 F0 80 80 missing its last byte",
        b"\xf0\x80\x80",
        false,
    ),
    ("6.14.6 DF missing its last byte", b"\xdf", false),
    ("6.14.7 EF BF missing its last byte", b"\xef\xbf", false),
    (
        "6.14.8 F7 BF BF missing its last byte",
        b"\xf7\xbf\xbf",
        false,
    ),
    (
        "6.15.1 incomplete sequences concatenated",
        b"\xc0\xe0\x80\xf0\x80\x80\xdf\xef\xbf\xf7\xbf\xbf",
        false,
    ),
    ("6.16.1 FE", b"\xfe", false),
    ("6.16.2 FF", b"\xff", false),
    ("6.16.3 FE FE FF FF", b"\xfe\xfe\xff\xff", false),
    ("6.17.1 overlong '/' in 2 bytes", b"\xc0\xaf", false),
    ("6.17.2 overlong '/' in 3 bytes", b"\xe0\x80\xaf", false),
    ("6.17.3 overlong '/' in 4 bytes", b"\xf0\x80\x80\xaf", false),
    ("6.18.1 largest overlong of 2 bytes", b"\xc1\xbf", false),
    ("6.18.2 largest overlong of 3 bytes", b"\xe0\x9f\xbf", false),
    (
        "6.18.3 largest overlong of 4 bytes",
        b"\xf0\x8f\xbf\xbf",
        false,
    ),
    ("6.19.1 overlong NUL in 2 bytes", b"\xc0\x80", false),
    ("6.19.2 overlong NUL in 3 bytes", b"\xe0\x80\x80", false),
    ("6.19.3 overlong NUL in 4 bytes", b"\xf0\x80\x80\x80", false),
    ("6.20.1 lone surrogate U+D800", b"\xed\xa0\x80", false),
    ("6.20.3 lone surrogate U+DB7F", b"\xed\xad\xbf", false),
    ("6.20.5 lone surrogate U+DBFF", b"\xed\xaf\xbf", false),
    ("6.20.6 lone surrogate U+DC00", b"\xed\xb0\x80", false),
    ("6.20.7 lone surrogate U+DFFF", b"\xed\xbf\xbf", false),
    (
        "6.21.1 surrogate pair D800 DC00",
        b"\xed\xa0\x80\xed\xb0\x80",
        false,
    ),
    (
        "6.21.8 surrogate pair DBFF DFFF",
        b"\xed\xaf\xbf\xed\xbf\xbf",
        false,
    ),
    ("6.22.1 noncharacter U+FFFE", b"\xef\xbf\xbe", true),
    ("6.22.2 noncharacter U+FFFF", b"\xef\xbf\xbf", true),
    ("6.22.3 noncharacter U+1FFFE", b"\xf0\x9f\xbf\xbe", true),
    ("6.22.34 noncharacter U+10FFFF", b"\xf4\x8f\xbf\xbf", true),
    ("6.22.35 noncharacter U+FDD0", b"\xef\xb7\x90", true),
    ("6.23.1 U+FFFD", b"\xef\xbf\xbd", true),
    ("6.23.7 U+FEFF (BOM) inside a text", b"a\xef\xbb\xbfb", true),
];

/// Runs every row of [`UTF8_SEQUENCES`] on a connection of its own, cut as
/// `cut` says, and fails naming every row whose answer was wrong.
fn utf8_table(cut: Cut, how: &str) {
    let addr = core();
    let mut failed = Vec::new();
    for (name, bytes, valid) in UTF8_SEQUENCES {
        let expected = if *valid { "answered" } else { "Close 1007" };
        let case = format!("Autobahn {name}, RFC 6455 8.1, {how}: {expected}");
        let run = std::panic::catch_unwind(|| {
            if *valid {
                let mut ws = Ws::open(&addr, &case);
                ws.send_frames(&cut.frames(&tag_req("s", bytes)));
                ws.expect_eose("s");
                ws.close_normally();
            } else {
                let mut ws = Ws::open(&addr, &case);
                ws.send(&cut.frames(&tag_req("s", bytes)).concat());
                ws.expect_close(1007);
            }
        });
        if let Err(e) = run {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(why);
        }
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn ab_6_5_to_6_23_utf8_sequences_in_one_frame() {
    utf8_table(Cut::Whole, "in one frame");
}

#[test]
fn ab_6_5_to_6_23_utf8_sequences_fragmented_at_every_byte() {
    utf8_table(Cut::EveryByte, "in 1-byte fragments");
}

// ------------------------------------------------------ 7: close handling

#[test]
fn ab_7_1_1_a_text_then_a_close() {
    let case = "Autobahn 7.1.1, RFC 6455 7.1.2: text answered, then Close 1000 echoed, then TCP closed by the relay";
    let mut ws = Ws::open(&core(), case);
    ws.send(&text(&short_req("s")));
    ws.expect_eose("s");
    ws.close_normally();
}

#[test]
fn ab_7_1_2_two_closes_get_one_echo() {
    let case = "Autobahn 7.1.2, RFC 6455 5.5.1: Close, Close: one Close echoed, TCP closed";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[close(1000, b""), close(1000, b"")].concat());
    ws.expect_close(1000);
}

#[test]
fn ab_7_1_3_a_ping_after_a_close_is_not_answered() {
    let case = "Autobahn 7.1.3, RFC 6455 5.5.1: Close, Ping: the Close echoed, no Pong";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[close(1000, b""), ping(b"after close")].concat());
    ws.expect_close(1000);
}

#[test]
fn ab_7_1_4_a_text_after_a_close_is_not_answered() {
    let case = "Autobahn 7.1.4, RFC 6455 5.5.1: Close, text: the Close echoed, no answer";
    let mut ws = Ws::open(&core(), case);
    ws.send(&[close(1000, b""), text(&short_req("s"))].concat());
    ws.expect_close(1000);
}

#[test]
fn ab_7_1_5_a_fragmented_text_around_a_close_is_not_answered() {
    let case = "Autobahn 7.1.5, RFC 6455 5.5.1: text fragment, Close, last fragment: the Close echoed, no answer";
    let mut ws = Ws::open(&core(), case);
    ws.send(
        &[
            text_first(b"[\"REQ\","),
            close(1000, b""),
            cont(true, b"\"s\",{}]"),
        ]
        .concat(),
    );
    ws.expect_close(1000);
}

#[test]
fn ab_7_1_6_messages_before_a_close_are_all_answered_first() {
    let case = "Autobahn 7.1.6, RFC 6455 7.1.2: 100 texts then a Close (one write): 100 answers, then the Close echoed";
    let mut ws = Ws::open(&core(), case);
    let mut all: Vec<u8> = (0..100)
        .flat_map(|i| text(format!("not json {i}").as_bytes()))
        .collect();
    all.extend(close(1000, b""));
    all.extend(ping(b"after close"));
    ws.send(&all);
    for _ in 0..100 {
        ws.expect_notice();
    }
    ws.expect_close(1000);
}

#[test]
fn ab_7_3_1_a_close_with_no_body_gets_1000() {
    // RFC 6455 7.1.5: no code received reads as 1005; the relay answers 1000.
    let case =
        "Autobahn 7.3.1, RFC 6455 5.5.1: Close with an empty body: Close 1000 back, TCP closed";
    let mut ws = Ws::open(&core(), case);
    ws.send(&frame(true, 0, CLOSE, b""));
    ws.expect_close(1000);
}

#[test]
fn ab_7_3_2_a_close_with_a_1_byte_body_fails_with_1002() {
    let case = "Autobahn 7.3.2, RFC 6455 5.5.1: Close with a 1-byte body: Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&frame(true, 0, CLOSE, b"\x03"));
    ws.expect_close(1002);
}

#[test]
fn ab_7_3_3_a_close_with_a_code_and_no_reason_is_echoed() {
    let case = "Autobahn 7.3.3, RFC 6455 5.5.1: Close 1000 with no reason echoed";
    let mut ws = Ws::open(&core(), case);
    ws.send(&close(1000, b""));
    ws.expect_close(1000);
}

#[test]
fn ab_7_3_4_a_close_with_a_reason_is_echoed() {
    let case = "Autobahn 7.3.4, RFC 6455 5.5.1: Close 1000 \"Hello World!\" echoed (1000)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&close(1000, b"Hello World!"));
    ws.expect_close(1000);
}

#[test]
fn ab_7_3_5_a_close_with_a_123_byte_reason_is_echoed() {
    let case =
        "Autobahn 7.3.5, RFC 6455 5.5: Close 1000 with a 123-byte reason (125-byte body) echoed";
    let mut ws = Ws::open(&core(), case);
    ws.send(&close(1000, &[b'*'; 123]));
    ws.expect_close(1000);
}

#[test]
fn ab_7_3_6_a_close_with_a_124_byte_reason_fails_with_1002() {
    let case =
        "Autobahn 7.3.6, RFC 6455 5.5: Close with a 124-byte reason (126-byte body): Close 1002";
    let mut ws = Ws::open(&core(), case);
    ws.send(&close(1000, &[b'*'; 124]));
    ws.expect_close(1002);
}

#[test]
fn ab_7_5_1_a_close_reason_that_is_not_utf8_fails_with_1007() {
    let case = "Autobahn 7.5.1, RFC 6455 5.5.1/8.1: Close 1000 with a reason that is not UTF-8: Close 1007";
    let mut ws = Ws::open(&core(), case);
    ws.send(&close(1000, INVALID_KOSME));
    ws.expect_close(1007);
}

/// Runs one connection per code: `echoed` codes come back in the Close,
/// the others get 1002.
fn close_codes(rows: &[(&str, u16)], echoed: bool) {
    let addr = core();
    let mut failed = Vec::new();
    for (name, code) in rows {
        let expected = if echoed { *code } else { 1002 };
        let case = format!("Autobahn {name}, RFC 6455 7.4: Close {code}: Close {expected}");
        let run = std::panic::catch_unwind(|| {
            let mut ws = Ws::open(&addr, &case);
            ws.send(&close(*code, b""));
            ws.expect_close(expected);
        });
        if run.is_err() {
            failed.push(case);
        }
    }
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}

#[test]
fn ab_7_7_valid_close_codes_are_echoed() {
    close_codes(
        &[
            ("7.7.1", 1000),
            ("7.7.2", 1001),
            ("7.7.3", 1002),
            ("7.7.4", 1003),
            ("7.7.5", 1007),
            ("7.7.6", 1008),
            ("7.7.7", 1009),
            ("7.7.8", 1010),
            ("7.7.9", 1011),
            ("7.7.10", 3000),
            ("7.7.11", 3999),
            ("7.7.12", 4000),
            ("7.7.13", 4999),
        ],
        true,
    );
}

#[test]
fn ab_7_9_invalid_close_codes_fail_with_1002() {
    // 1004 is reserved, 1005 and 1006 must not be sent (RFC 6455 7.4.1);
    // 1016 to 2999 are unassigned protocol codes; below 1000 is unused.
    close_codes(
        &[
            ("7.9.1", 0),
            ("7.9.2", 999),
            ("7.9.3", 1004),
            ("7.9.4", 1005),
            ("7.9.5", 1006),
            ("7.9.6", 1016),
            ("7.9.7", 1100),
            ("7.9.8", 2000),
            ("7.9.9", 2999),
        ],
        false,
    );
}

#[test]
fn rfc_7_4_iana_codes_1012_to_1014_are_echoed_and_1015_refused() {
    // Not in Autobahn's current lists (older versions had them in 7.9).
    // 1012 to 1014 (service restart, try again later, bad gateway) are in
    // the IANA registry of RFC 6455 11.7, registered after the RFC: a
    // client may close with them. 1015 must never be sent in a Close
    // (RFC 6455 7.4.1).
    close_codes(
        &[
            ("(none), IANA 1012", 1012),
            ("(none), IANA 1013", 1013),
            ("(none), IANA 1014", 1014),
        ],
        true,
    );
    close_codes(&[("(none), RFC 6455 7.4.1 1015", 1015)], false);
}

/// The status line of the answer to a raw upgrade request.
fn upgrade_status(request: &str) -> String {
    let mut s = TcpStream::connect(core()).unwrap();
    s.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(2).any(|w| w == b"\r\n") {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without an answer");
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    text.lines().next().unwrap_or_default().to_string()
}

#[test]
fn rfc_4_2_1_an_upgrade_without_host_or_with_another_version_is_refused() {
    let head = |host: &str, version: &str| {
        format!(
            "GET / HTTP/1.1\r\n{host}Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: {version}\r\n\r\n"
        )
    };
    let host = format!("Host: {}\r\n", core());
    assert!(upgrade_status(&head(&host, "13")).starts_with("HTTP/1.1 101"));
    // RFC 6455 4.2.1 item 2: Host is required; 4.2.2: a bad request is 400.
    assert!(upgrade_status(&head("", "13")).starts_with("HTTP/1.1 400"));
    // 4.4: another version gets 426 with the version the server speaks.
    assert!(upgrade_status(&head(&host, "8")).starts_with("HTTP/1.1 426"));
}

#[test]
fn ab_7_13_codes_above_4999_are_refused_with_1002() {
    // Autobahn 7.13.x are informational ("undefined by the spec": it takes
    // 1000, the code, or 1002); the relay answers 1002.
    close_codes(&[("7.13.1", 5000), ("7.13.2", 65535)], false);
}

// ------------------------------------------------------------ 9: limits

#[test]
fn ab_9_1_a_text_of_the_message_limit_is_answered() {
    let case = "Autobahn 9.1, RFC 6455 10.4: text of exactly limits.max_message_bytes answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(&text(&req("s", LIMIT)));
    ws.expect_eose("s");
    ws.close_normally();
}

#[test]
fn ab_9_1_a_text_over_the_message_limit_gets_a_notice_and_the_connection_stays() {
    // Between the limit and the frame bound a message is read whole and
    // refused by the session (NIP-01), not by the WebSocket layer.
    for len in [LIMIT + 1, BOUND] {
        let case = format!(
            "Autobahn 9.1, RFC 6455 10.4: text of {len} bytes (over the limit, within the bound): NOTICE, connection open"
        );
        let mut ws = Ws::open(&core(), &case);
        ws.send(&text(&req("s", len)));
        let notice = ws.expect_notice();
        assert!(notice.contains("too large"), "{case}: {notice}");
        ws.expect_alive();
        ws.close_normally();
    }
}

#[test]
fn ab_9_1_a_text_frame_over_the_bound_fails_with_1009() {
    // Refused from its header: only the header is sent.
    let case = "Autobahn 9.1, RFC 6455 7.4.1/10.4: text frame of 2 x limit + 1 bytes: Close 1009 (after a NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&header_only(true, TEXT, (BOUND + 1) as u64));
    ws.expect_close_after_notice(1009);
}

#[test]
fn ab_9_2_a_binary_frame_over_the_bound_fails_with_1009() {
    let case = "Autobahn 9.2, RFC 6455 7.4.1/10.4: binary frame of 2 x limit + 1 bytes: Close 1009 (after a NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&header_only(true, BINARY, (BOUND + 1) as u64));
    ws.expect_close_after_notice(1009);
}

#[test]
fn ab_9_2_a_frame_announcing_a_terabyte_fails_with_1009() {
    let case =
        "Autobahn 9.2, RFC 6455 10.4: a frame announcing 2^40 bytes: Close 1009 (after a NOTICE)";
    let mut ws = Ws::open(&core(), case);
    ws.send(&header_only(true, BINARY, 1 << 40));
    ws.expect_close_after_notice(1009);
}

#[test]
fn ab_9_3_fragments_adding_up_past_the_bound_fail_with_1009() {
    let case = "Autobahn 9.3, RFC 6455 10.4: a text in fragments of 10000 bytes adding up to 2 x limit + 1: Close 1009 (after a NOTICE)";
    let mut ws = Ws::open(&core(), case);
    let message = req("s", BOUND + 1);
    ws.send(&fragmented(TEXT, &message, 10_000).concat());
    ws.expect_close_after_notice(1009);
}

#[test]
fn ab_9_3_a_message_of_the_limit_in_fragments_of_1000_is_answered() {
    let case =
        "Autobahn 9.3, RFC 6455 5.4: text of the limit in 100 fragments of 1000 bytes answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(&fragmented(TEXT, &req("s", LIMIT), 1000).concat());
    ws.expect_eose("s");
    ws.close_normally();
}

#[test]
fn ab_9_3_a_message_of_the_limit_in_fragments_of_64_is_answered() {
    let case =
        "Autobahn 9.3, RFC 6455 5.4: text of the limit in 1563 fragments of 64 bytes answered";
    let mut ws = Ws::open(&core(), case);
    ws.send(&fragmented(TEXT, &req("s", LIMIT), 64).concat());
    ws.expect_eose("s");
    ws.close_normally();
}

#[test]
fn ab_9_5_a_message_of_the_limit_in_chops_of_997_is_answered() {
    let case = "Autobahn 9.5, RFC 6455 5.2: text of the limit in one frame, written in chops of 997 bytes, answered";
    let mut ws = Ws::open(&core(), case);
    ws.send_chopped(&text(&req("s", LIMIT)), 997);
    ws.expect_eose("s");
    ws.close_normally();
}

#[test]
fn ab_9_7_a_thousand_texts_are_answered_in_order() {
    let case = "Autobahn 9.7, RFC 6455 5.6: 1000 texts in one write: 1000 answers, then the Pong of the Ping after them";
    let mut ws = Ws::open(&core(), case);
    let mut all: Vec<u8> = (0..1000)
        .flat_map(|i| text(format!("not json {i}").as_bytes()))
        .collect();
    all.extend(ping(b"last"));
    ws.send(&all);
    for _ in 0..1000 {
        ws.expect_notice();
    }
    ws.expect_pong(b"last");
    ws.close_normally();
}

#[test]
fn ab_9_7_a_thousand_pings_get_a_thousand_pongs_in_order() {
    let case = "Autobahn 9.7, RFC 6455 5.5.3: 1000 Pings in one write: 1000 Pongs in order";
    let mut ws = Ws::open(&core(), case);
    let all: Vec<u8> = (0..1000)
        .flat_map(|i| ping(format!("{i}").as_bytes()))
        .collect();
    ws.send(&all);
    for i in 0..1000 {
        ws.expect_pong(format!("{i}").as_bytes());
    }
    ws.close_normally();
}

#[test]
fn ab_9_7_a_hundred_reqs_are_each_answered() {
    // In rounds of limits.max_subscriptions (20), each round's CLOSEs in the
    // write of the next round's REQs; each REQ its own id (a REQ replacing an
    // open one of the same id may never get its EOSE, by NIP-01).
    let case = "Autobahn 9.7, RFC 6455 5.6: 100 REQs, 20 per write: 100 EOSEs";
    let mut ws = Ws::open(&core(), case);
    for round in 0..5 {
        let ids: Vec<String> = (0..20).map(|i| format!("r{round}-{i}")).collect();
        let mut all = Vec::new();
        if round > 0 {
            for i in 0..20 {
                let old = format!(r#"["CLOSE","r{}-{i}"]"#, round - 1);
                all.extend(text(old.as_bytes()));
            }
        }
        for (i, id) in ids.iter().enumerate() {
            all.extend(text(&req(id, 60 + i)));
        }
        ws.send(&all);
        let mut answered: Vec<String> = (0..20)
            .map(|_| {
                let v = ws.expect_json();
                assert_eq!(v[0], "EOSE", "{case}: {v}");
                v[1].as_str().unwrap().to_string()
            })
            .collect();
        answered.sort();
        let mut want = ids.clone();
        want.sort();
        assert_eq!(answered, want, "{case}: round {round}");
    }
    ws.close_normally();
}

// =================================================== 12-13: compression

/// permessage-deflate (RFC 7692), after Autobahn's sections 12 and 13: the
/// negotiation of each offer, and compressed messages both ways. Each
/// relay has an explicit `server.compression` mode and compresses every
/// message (`server.compression_min_bytes` 0).
mod compression {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    fn relay(mode: &'static str) -> String {
        shared_relay(
            mode,
            &[
                ("SLUICE_SERVER__COMPRESSION", mode),
                ("SLUICE_SERVER__COMPRESSION_MIN_BYTES", "0"),
            ],
        )
    }

    fn sliding() -> String {
        relay("sliding")
    }

    fn stateless() -> String {
        relay("stateless")
    }

    fn off() -> String {
        relay("off")
    }

    /// Raw DEFLATE of `data` with a window of `bits`: ended by a sync
    /// flush, its trailer taken off (RFC 7692 7.2.1), or by a final block.
    fn deflate(data: &[u8], bits: u8, final_block: bool) -> Vec<u8> {
        deflate_chunks(&[data], bits, final_block)
    }

    /// [`deflate`] of the concatenation of `chunks`.
    fn deflate_chunks(chunks: &[&[u8]], bits: u8, final_block: bool) -> Vec<u8> {
        let mut c = Compress::new_with_window_bits(Compression::default(), false, bits);
        let mut out = Vec::with_capacity(1024);
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.iter().enumerate() {
            let flush = match (i == last, final_block) {
                (false, _) => FlushCompress::None,
                (true, false) => FlushCompress::Sync,
                (true, true) => FlushCompress::Finish,
            };
            let start = c.total_in();
            loop {
                if out.capacity() - out.len() < 1024 {
                    out.reserve(out.capacity().max(1024));
                }
                let done = (c.total_in() - start) as usize;
                let status = c.compress_vec(&chunk[done..], &mut out, flush).unwrap();
                let consumed = (c.total_in() - start) as usize == chunk.len();
                let flushed = match flush {
                    FlushCompress::None => true,
                    FlushCompress::Finish => status == flate2::Status::StreamEnd,
                    _ => out.len() < out.capacity(),
                };
                if consumed && flushed {
                    break;
                }
            }
        }
        if !final_block {
            assert!(
                out.ends_with(&[0x00, 0x00, 0xff, 0xff]),
                "a sync flush's trailer"
            );
            out.truncate(out.len() - 4);
        }
        out
    }

    impl Ws {
        /// A compressed text message in one frame (RSV1 set).
        fn compressed_text(&self, message: &[u8]) -> Vec<u8> {
            let bits = self.deflate.as_ref().map_or(15, |p| p.client_bits);
            frame(true, RSV1, TEXT, &deflate(message, bits, false))
        }

        /// The next message is a compressed text (every message is, with
        /// `compression_min_bytes` 0); its JSON.
        fn expect_compressed_json(&mut self) -> Value {
            let v = self.expect_json();
            assert!(
                self.last_compressed,
                "{}: an uncompressed message ({v}) with compression_min_bytes 0",
                self.case
            );
            v
        }

        /// The next message is the compressed EOSE of `sub`.
        fn expect_compressed_eose(&mut self, sub: &str) {
            let v = self.expect_compressed_json();
            assert_eq!(v, serde_json::json!(["EOSE", sub]), "{}", self.case);
        }
    }

    /// The agreed parameters' names, sorted.
    fn agreed(ws: &Ws) -> Vec<String> {
        let Some(pmd) = ws.deflate.as_ref() else {
            panic!("{}: permessage-deflate was not agreed", ws.case);
        };
        let mut names: Vec<String> = pmd.names().into_iter().map(String::from).collect();
        names.sort();
        names
    }

    // ------------------------------------------------------- negotiation

    /// One offer, and the parameters the answer must carry.
    fn negotiates(addr: &str, case: &str, offers: &[&str], expected: &[&str]) -> Ws {
        let ws = Ws::offer(addr, case, offers);
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(agreed(&ws), want, "{case}: the answer {:?}", ws.extensions);
        ws
    }

    /// A compressed REQ and the compressed EOSE back, then a clean close.
    fn round_trip(mut ws: Ws) {
        let message = short_req("z");
        let f = ws.compressed_text(&message);
        ws.send(&f);
        ws.expect_compressed_eose("z");
        ws.close_normally();
    }

    #[test]
    fn ab_13_1_a_plain_offer_to_a_sliding_relay_agrees_client_no_context_takeover() {
        let case = "Autobahn 13.1, RFC 7692 5/7.1: offer permessage-deflate to mode sliding: answer permessage-deflate; client_no_context_takeover";
        let ws = negotiates(
            &sliding(),
            case,
            &["permessage-deflate"],
            &["client_no_context_takeover"],
        );
        assert_eq!(
            ws.extensions,
            ["permessage-deflate; client_no_context_takeover"],
            "{case}"
        );
        round_trip(ws);
    }

    #[test]
    fn ab_13_1_a_plain_offer_to_a_stateless_relay_adds_server_no_context_takeover() {
        let case = "Autobahn 13.1, RFC 7692 7.1.1.1: offer permessage-deflate to mode stateless: server_no_context_takeover and client_no_context_takeover";
        let ws = negotiates(
            &stateless(),
            case,
            &["permessage-deflate"],
            &["client_no_context_takeover", "server_no_context_takeover"],
        );
        round_trip(ws);
    }

    #[test]
    fn ab_13_2_an_offer_of_server_no_context_takeover_is_honoured() {
        for offer in [
            "permessage-deflate; server_no_context_takeover",
            "permessage-deflate ; server_no_context_takeover",
            "permessage-deflate;server_no_context_takeover",
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        ] {
            let case = format!(
                "Autobahn 13.2, RFC 7692 7.1.1.1: offer {offer:?} to mode sliding: both no_context_takeover"
            );
            let ws = negotiates(
                &sliding(),
                &case,
                &[offer],
                &["client_no_context_takeover", "server_no_context_takeover"],
            );
            round_trip(ws);
        }
    }

    #[test]
    fn ab_13_3_an_offer_of_client_max_window_bits_is_accepted() {
        for (offer, at_most) in [
            ("permessage-deflate; client_max_window_bits", 15),
            ("permessage-deflate; client_max_window_bits=10", 10),
            ("permessage-deflate; client_max_window_bits=15", 15),
        ] {
            let case = format!(
                "Autobahn 13.3, RFC 7692 7.1.2.2: offer {offer:?}: accepted, client_max_window_bits in the answer at most the offer's"
            );
            let ws = Ws::offer(&sliding(), &case, &[offer]);
            let names = agreed(&ws);
            assert!(
                names.contains(&"client_no_context_takeover".to_string()),
                "{case}: {names:?}"
            );
            assert!(
                !names.contains(&"server_max_window_bits".to_string()),
                "{case}: {names:?}"
            );
            let pmd = ws.deflate.clone().unwrap();
            if let Some(v) = pmd.value("client_max_window_bits") {
                let bits: u8 = v.parse().unwrap();
                assert!(bits <= at_most, "{case}: client_max_window_bits={bits}");
            }
            round_trip(ws);
        }
    }

    #[test]
    fn ab_13_5_an_offer_of_server_max_window_bits_is_honoured() {
        for bits in [9, 10, 12, 15] {
            let offer = format!("permessage-deflate; server_max_window_bits={bits}");
            let case = format!(
                "Autobahn 13.5, RFC 7692 7.1.2.1: offer {offer:?}: answer server_max_window_bits={bits}"
            );
            let ws = negotiates(
                &sliding(),
                &case,
                &[&offer],
                &["client_no_context_takeover", "server_max_window_bits"],
            );
            assert_eq!(
                ws.deflate.as_ref().unwrap().value("server_max_window_bits"),
                Some(bits.to_string().as_str()),
                "{case}"
            );
            round_trip(ws);
        }
    }

    #[test]
    fn rfc_7692_7_1_a_quoted_parameter_value_is_read() {
        let case = "RFC 7692 7.1.2.1/RFC 6455 9.1: offer server_max_window_bits=\"10\" (quoted-string): answer server_max_window_bits=10";
        let ws = negotiates(
            &sliding(),
            case,
            &["permessage-deflate; server_max_window_bits=\"10\""],
            &["client_no_context_takeover", "server_max_window_bits"],
        );
        assert_eq!(ws.deflate.as_ref().unwrap().server_bits, 10, "{case}");
        round_trip(ws);
    }

    /// An offer the relay cannot honour is declined: no extension in the
    /// 101, and the connection works uncompressed.
    fn declined(addr: &str, case: &str, offers: &[&str]) {
        let mut ws = Ws::offer(addr, case, offers);
        assert!(
            ws.extensions.is_empty(),
            "{case}: agreed {:?}",
            ws.extensions
        );
        ws.send(&text(&short_req("s")));
        ws.expect_eose("s");
        assert!(!ws.last_compressed, "{case}");
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_7_1_offers_that_cannot_be_honoured_are_declined() {
        for offer in [
            "permessage-deflate; server_max_window_bits=8",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=0",
            "permessage-deflate; server_max_window_bits=09",
            "permessage-deflate; server_max_window_bits=abc",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; client_max_window_bits; client_max_window_bits",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover=x",
            "permessage-deflate; mystery",
            "permessage-deflate; mystery=1",
            "x-webkit-deflate-frame",
            "deflate-frame",
        ] {
            let case = format!(
                "RFC 7692 5/7.1: offer {offer:?} (unknown, repeated or bad parameter; window of 8 bits): declined, uncompressed"
            );
            declined(&sliding(), &case, &[offer]);
        }
    }

    #[test]
    fn rfc_7692_5_the_first_acceptable_offer_is_agreed() {
        for (offers, bits) in [
            (
                &["permessage-deflate; mystery, permessage-deflate; server_max_window_bits=12"][..],
                Some(12),
            ),
            (
                &["permessage-deflate; server_max_window_bits=8, permessage-deflate"][..],
                None,
            ),
            (
                &["x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=11"][..],
                Some(11),
            ),
            (
                &[
                    "permessage-deflate; server_max_window_bits=10, permessage-deflate; server_max_window_bits=11",
                ][..],
                Some(10),
            ),
            // RFC 6455 9.1: header lines count as one comma-separated list.
            (
                &[
                    "permessage-deflate; server_max_window_bits=8",
                    "permessage-deflate; server_max_window_bits=13",
                ][..],
                Some(13),
            ),
        ] {
            let case = format!(
                "RFC 7692 5, RFC 6455 9.1: offers {offers:?}: the first acceptable one agreed (window {bits:?})"
            );
            let ws = Ws::offer(&sliding(), &case, offers);
            let pmd = ws
                .deflate
                .clone()
                .unwrap_or_else(|| panic!("{case}: nothing agreed"));
            assert_eq!(
                pmd.value("server_max_window_bits")
                    .map(|v| v.parse::<u8>().unwrap()),
                bits,
                "{case}: {:?}",
                ws.extensions
            );
            round_trip(ws);
        }
    }

    #[test]
    fn mode_off_never_agrees_and_rsv1_fails_with_1002() {
        for offer in [
            "permessage-deflate",
            "permessage-deflate; server_no_context_takeover",
        ] {
            declined(
                &off(),
                &format!("server.compression off: offer {offer:?}: nothing agreed, uncompressed"),
                &[offer],
            );
        }
        let case = "server.compression off, RFC 6455 5.2: a compressed (RSV1) message with nothing agreed: Close 1002";
        let mut ws = Ws::offer(&off(), case, &["permessage-deflate"]);
        assert!(ws.extensions.is_empty(), "{case}");
        ws.send(&frame(
            true,
            RSV1,
            TEXT,
            &deflate(&short_req("s"), 15, false),
        ));
        ws.expect_close(1002);
    }

    #[test]
    fn rfc_6455_5_2_rsv1_with_no_offer_fails_with_1002() {
        let case =
            "RFC 6455 5.2: mode sliding, no offer: no extension, and an RSV1 text: Close 1002";
        let mut ws = Ws::open(&sliding(), case);
        ws.send(&frame(
            true,
            RSV1,
            TEXT,
            &deflate(&short_req("s"), 15, false),
        ));
        ws.expect_close(1002);
    }

    // -------------------------------------------------------- messages

    #[test]
    fn ab_12_1_answers_are_compressed_in_sliding_mode() {
        let case = "Autobahn 12.1, RFC 7692 6/7.2.1: mode sliding: a plain REQ's EOSE comes compressed (RSV1), 20 times over one context";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        for _ in 0..20 {
            ws.send(&text(&short_req("s")));
            ws.expect_compressed_eose("s");
        }
        ws.close_normally();
    }

    #[test]
    fn ab_12_1_answers_are_compressed_on_their_own_in_stateless_mode() {
        // Each message is inflated with a fresh inflater (server_no_context_takeover).
        let case = "Autobahn 12.1, RFC 7692 7.1.1.1: mode stateless: 20 EOSEs compressed, each inflating on its own";
        let mut ws = Ws::offer(&stateless(), case, &["permessage-deflate"]);
        assert!(ws.deflate.as_ref().unwrap().server_no_context, "{case}");
        for _ in 0..20 {
            ws.send(&text(&short_req("s")));
            ws.expect_compressed_eose("s");
        }
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_6_a_compressed_client_message_is_inflated() {
        for addr in [sliding(), stateless()] {
            let case = "Autobahn 12/13, RFC 7692 6/7.2.2: a compressed REQ (RSV1) is inflated and answered";
            let ws = Ws::offer(&addr, case, &["permessage-deflate"]);
            round_trip(ws);
        }
    }

    #[test]
    fn rfc_7692_6_1_a_compressed_message_in_fragments_is_inflated() {
        let case = "RFC 7692 6.1: a compressed REQ in 3 frames (RSV1 on the first only) is inflated and answered";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        let z = deflate(&req("s", 300), 15, false);
        let third = z.len() / 3;
        ws.send(
            &[
                frame(false, RSV1, TEXT, &z[..third]),
                cont(false, &z[third..2 * third]),
                cont(true, &z[2 * third..]),
            ]
            .concat(),
        );
        ws.expect_compressed_eose("s");
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_7_2_3_a_message_ending_in_a_final_block_is_inflated() {
        let case = "RFC 7692 7.2.3.4: a compressed REQ ending with a final (BFINAL) block is inflated and answered";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        ws.send(&frame(
            true,
            RSV1,
            TEXT,
            &deflate(&short_req("s"), 15, true),
        ));
        ws.expect_compressed_eose("s");
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_7_2_3_an_empty_compressed_message_is_answered() {
        let case = "RFC 7692 7.2.3.6: an empty text compressed (payload 0x00) is inflated: answered (NOTICE)";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        ws.send(&frame(true, RSV1, TEXT, &[0x00]));
        let v = ws.expect_compressed_json();
        assert_eq!(v[0], "NOTICE", "{case}: {v}");
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_6_an_uncompressed_message_after_agreement_is_read() {
        let case = "RFC 7692 6: with the extension agreed, a message without RSV1 is read as is and answered";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        ws.send(&text(&short_req("s")));
        ws.expect_compressed_eose("s");
        let both = [ws.compressed_text(&short_req("t")), text(&short_req("u"))].concat();
        ws.send(&both);
        // Two queries: their EOSEs in either order.
        let mut subs =
            [ws.expect_compressed_json(), ws.expect_compressed_json()].map(|v| v.to_string());
        subs.sort();
        assert_eq!(subs, [r#"["EOSE","t"]"#, r#"["EOSE","u"]"#], "{case}");
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_6_1_rsv1_on_a_continuation_fails_with_1002() {
        let case = "RFC 7692 6.1: RSV1 on a continuation frame: Close 1002";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        let z = deflate(&req("s", 300), 15, false);
        ws.send(
            &[
                frame(false, RSV1, TEXT, &z[..10]),
                frame(true, RSV1, CONT, &z[10..]),
            ]
            .concat(),
        );
        ws.expect_close(1002);
    }

    #[test]
    fn rfc_7692_6_1_rsv1_on_a_control_frame_fails_with_1002() {
        for (name, opcode, payload) in [
            ("Ping", PING, b"ping".to_vec()),
            ("Pong", PONG, b"pong".to_vec()),
            ("Close", CLOSE, close_body(1000, b"")),
        ] {
            let case = format!("RFC 7692 6.1: RSV1 on a {name}: Close 1002");
            let mut ws = Ws::offer(&sliding(), &case, &["permessage-deflate"]);
            ws.send(&frame(true, RSV1, opcode, &payload));
            ws.expect_close(1002);
        }
    }

    #[test]
    fn rfc_6455_5_2_rsv2_and_rsv3_still_fail_with_the_extension() {
        for rsv in [RSV2, RSV3, RSV1 | RSV2] {
            let case = format!(
                "RFC 6455 5.2/RFC 7692 6: reserved bits {rsv:03b} (permessage-deflate uses RSV1 only): Close 1002"
            );
            let mut ws = Ws::offer(&sliding(), &case, &["permessage-deflate"]);
            ws.send(&frame(
                true,
                rsv,
                TEXT,
                &deflate(&short_req("s"), 15, false),
            ));
            ws.expect_close(1002);
        }
    }

    #[test]
    fn rfc_7692_8_a_compressed_text_that_is_not_utf8_fails_with_1007() {
        let case =
            "RFC 7692 8, RFC 6455 8.1: a compressed text inflating to invalid UTF-8: Close 1007";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        let f = ws.compressed_text(&tag_req("s", INVALID_KOSME));
        ws.send(&f);
        ws.expect_close(1007);
    }

    #[test]
    fn rfc_7692_8_data_that_does_not_inflate_fails_the_connection() {
        // Block type 3 is reserved in DEFLATE (RFC 1951 3.2.3). No close code
        // is named for it: 1002 (protocol) or 1007 (invalid data).
        let case = "RFC 7692 8: compressed data that is not DEFLATE: the connection fails (Close 1002 or 1007)";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        ws.send(&frame(true, RSV1, TEXT, &[0xff; 16]));
        match ws.next() {
            Msg::Close(Some(1002 | 1007), _) => ws.expect_gone(),
            other => panic!("{case}: got {other:?}"),
        }
    }

    #[test]
    fn rfc_7692_8_a_message_inflating_over_the_limit_gets_a_notice() {
        let case = "RFC 7692 8, Autobahn 9.1: a compressed text inflating past the limit (within the bound): NOTICE, connection open";
        let mut ws = Ws::offer(&sliding(), case, &["permessage-deflate"]);
        let f = ws.compressed_text(&req("s", LIMIT + 1000));
        ws.send(&f);
        let v = ws.expect_compressed_json();
        assert!(
            v[0] == "NOTICE" && v[1].as_str().unwrap().contains("too large"),
            "{case}: {v}"
        );
        ws.expect_alive();
        ws.close_normally();
    }

    #[test]
    fn rfc_7692_8_a_message_inflating_past_the_bound_fails_with_1009() {
        for fragments in [1, 4] {
            let case = format!(
                "RFC 7692 8, RFC 6455 7.4.1: a compressed text inflating to 2 x limit + 1 ({fragments} frame(s)): Close 1009"
            );
            let mut ws = Ws::offer(&sliding(), &case, &["permessage-deflate"]);
            let z = deflate(&req("s", BOUND + 1), 15, false);
            let size = z.len().div_ceil(fragments);
            let mut frames = fragmented(TEXT, &z, size);
            // RSV1 on the first frame.
            frames[0][0] |= RSV1 << 4;
            ws.send(&frames.concat());
            ws.expect_close_after_notice(1009);
        }
    }

    #[test]
    fn rfc_7692_8_a_deflate_bomb_fails_with_1009() {
        // 100 MB of zeros: DEFLATE's best is about 1:1030, so some 100 KB
        // on the wire (within the frame bound); past 2 x limit inflating
        // must stop and the connection fail, bounded by ANSWER_TIMEOUT.
        let zeros = vec![0u8; 1 << 20];
        let chunks: Vec<&[u8]> = (0..100).map(|_| &zeros[..]).collect();
        let bomb = deflate_chunks(&chunks, 15, false);
        assert!(bomb.len() < BOUND, "{} bytes", bomb.len());
        for addr in [sliding(), stateless()] {
            let case = format!(
                "RFC 7692 8, RFC 6455 10.4: {} compressed bytes inflating to 100 MB: Close 1009",
                bomb.len()
            );
            let mut ws = Ws::offer(&addr, &case, &["permessage-deflate"]);
            ws.send(&frame(true, RSV1, TEXT, &bomb));
            ws.expect_close_after_notice(1009);
        }
    }

    // ------------------------------------------------ real Nostr traffic

    /// Real signed kind-1 events (tests/fixtures/real-events.jsonl) the
    /// relay stores: none with an `expiration` or a `-` tag.
    fn real_events(n: usize) -> Vec<(String, String)> {
        include_str!("fixtures/real-events.jsonl")
            .lines()
            .filter_map(|line| {
                let v: Value = serde_json::from_str(line).ok()?;
                let tags = v["tags"].as_array()?;
                let plain =
                    v["kind"] == 1 && tags.iter().all(|t| t[0] != "expiration" && t[0] != "-");
                plain.then(|| (v["id"].as_str().unwrap().to_string(), line.to_string()))
            })
            .take(n)
            .collect()
    }

    /// Publishes `events` compressed (each OK true, compressed), then reads
    /// them back by id, compressed, byte for byte; then a live one.
    fn exchange(ws: &mut Ws, events: &[(String, String)]) {
        let case = ws.case.clone();
        for (id, raw) in events {
            let f = ws.compressed_text(format!("[\"EVENT\",{raw}]").as_bytes());
            ws.send(&f);
            let ok = ws.expect_compressed_json();
            assert!(
                ok[0] == "OK" && ok[1] == id.as_str() && ok[2] == true,
                "{case}: {ok}"
            );
        }
        let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
        let f = ws.compressed_text(
            serde_json::json!(["REQ", "r", {"ids": ids}])
                .to_string()
                .as_bytes(),
        );
        ws.send(&f);
        let mut served = Vec::new();
        loop {
            let v = ws.expect_compressed_json();
            match v[0].as_str() {
                Some("EVENT") if v[1] == "r" => {
                    served.push(v[2]["id"].as_str().unwrap().to_string())
                }
                Some("EOSE") if v[1] == "r" => break,
                _ => panic!("{case}: {v}"),
            }
        }
        served.sort();
        let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(served, want, "{case}: the events served back");
        // Byte for byte, each on its own.
        for (id, raw) in events.iter().take(3) {
            let f = ws.compressed_text(
                serde_json::json!(["REQ", "one", {"ids": [id]}])
                    .to_string()
                    .as_bytes(),
            );
            ws.send(&f);
            let t = ws.expect_text();
            assert!(ws.last_compressed, "{case}");
            assert_eq!(
                support::event_object_text(&t),
                *raw,
                "{case}: served as stored"
            );
            ws.expect_compressed_eose("one");
        }
        // A live event, sent to a subscription, compressed.
        let content = format!("{case} {}", "live ".repeat(200));
        let live = support::ev(7, support::now(), 1, &[], &content);
        let f = ws.compressed_text(
            serde_json::json!(["REQ", "live", {"ids": [live.id_hex()]}])
                .to_string()
                .as_bytes(),
        );
        ws.send(&f);
        ws.expect_compressed_eose("live");
        let f = ws.compressed_text(format!("[\"EVENT\",{}]", live.raw()).as_bytes());
        ws.send(&f);
        let mut got_event = false;
        let mut got_ok = false;
        while !(got_event && got_ok) {
            let v = ws.expect_compressed_json();
            match v[0].as_str() {
                Some("EVENT") if v[1] == "live" => {
                    assert_eq!(v[2]["content"], content.as_str(), "{case}");
                    got_event = true;
                }
                Some("OK") if v[1] == live.id_hex().as_str() => {
                    assert_eq!(v[2], true, "{case}: {v}");
                    got_ok = true;
                }
                _ => panic!("{case}: {v}"),
            }
        }
    }

    #[test]
    fn ab_13_real_events_round_trip_compressed_per_offer() {
        let events = real_events(12);
        assert_eq!(events.len(), 12);
        let offers = [
            ("13.1", "permessage-deflate"),
            ("13.2", "permessage-deflate; server_no_context_takeover"),
            ("13.3", "permessage-deflate; client_max_window_bits"),
            ("13.4", "permessage-deflate; client_no_context_takeover"),
            ("13.5", "permessage-deflate; server_max_window_bits=9"),
            ("13.6", "permessage-deflate; server_max_window_bits=15"),
            (
                "13.7",
                "permessage-deflate; server_no_context_takeover; client_max_window_bits=9; server_max_window_bits=9",
            ),
        ];
        for mode in ["sliding", "stateless"] {
            for (section, offer) in offers {
                let case = format!(
                    "Autobahn {section}, RFC 7692 7: mode {mode}, offer {offer:?}: real events published and served back compressed"
                );
                let mut ws = Ws::offer(&relay(mode), &case, &[offer]);
                assert!(ws.deflate.is_some(), "{case}: nothing agreed");
                exchange(&mut ws, &events);
                ws.close_normally();
            }
        }
    }

    #[test]
    fn ab_12_large_messages_are_compressed_both_ways() {
        // A 60 KB event (content within limits.max_content_bytes), twice:
        // the second may refer to the first in sliding mode.
        for mode in ["sliding", "stateless"] {
            let case = format!(
                "Autobahn 12.x, RFC 7692 7.2: mode {mode}: a 60 KB event published compressed and served compressed, twice"
            );
            let mut ws = Ws::offer(&relay(mode), &case, &["permessage-deflate"]);
            let content: String = (0..60_000u32)
                .map(|i| char::from(b'a' + ((i * 7919) % 26) as u8))
                .collect();
            let e = support::ev(9, support::now(), 1, &[], &content);
            let f = ws.compressed_text(format!("[\"EVENT\",{}]", e.raw()).as_bytes());
            ws.send(&f);
            let ok = ws.expect_compressed_json();
            assert_eq!(ok[2], true, "{case}: {ok}");
            for _ in 0..2 {
                ws.send(&text(
                    serde_json::json!(["REQ", "big", {"ids": [e.id_hex()]}])
                        .to_string()
                        .as_bytes(),
                ));
                let t = ws.expect_text();
                assert!(ws.last_compressed, "{case}");
                assert_eq!(support::event_object_text(&t), e.raw(), "{case}");
                ws.expect_compressed_eose("big");
            }
            ws.close_normally();
        }
    }

    #[test]
    fn uncompressed_with_mode_off() {
        let case = "server.compression off: answers are never compressed";
        let mut ws = Ws::offer(&off(), case, &["permessage-deflate"]);
        assert!(ws.extensions.is_empty(), "{case}");
        for i in 0..3 {
            ws.send(&text(&req("s", 200 + i)));
            ws.expect_eose("s");
            assert!(!ws.last_compressed, "{case}");
        }
        ws.close_normally();
    }

    #[test]
    fn the_clients_deflate_round_trips_through_the_clients_inflate() {
        // The test's own helpers, checked against each other (no relay).
        for bits in [9, 12, 15] {
            for final_block in [false, true] {
                let data = req("s", 5000);
                let z = deflate(&data, bits, final_block);
                let mut d = flate2::Decompress::new_with_window_bits(false, bits);
                let (out, _) = inflate(&mut d, &z).unwrap();
                assert_eq!(out, data);
            }
        }
        assert_eq!(deflate(b"", 15, false), [0x00]);
    }
}
