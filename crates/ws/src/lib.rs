//! The relay's own WebSocket server side (RFC 6455, and RFC 7692's
//! permessage-deflate), built for many idle connections: an idle
//! connection holds no buffer at all. No Nostr and no HTTP server here:
//! `sluice-server` takes the connection over and speaks NIP-01 on it.
//!
//! - `handshake`: the upgrade request's checks, pure.
//! - `extension`: permessage-deflate's negotiation (RFC 7692), pure.
//! - `deflate`: compressing a connection's messages and inflating a
//!   client's, with the worker thread's compressors; a connection keeps at
//!   most its window (`sliding` mode), bounded in total.
//! - `frame`: client frame headers, unmasking, server frame headers (pure).
//! - `read`: `WsRead`, messages parsed in the worker thread's read
//!   buffer; a connection keeps only bytes of a frame not yet whole.
//!   `ReadState` is the same without the socket, given to each call.
//! - `send`: `WsWrite`, frames written at once or held until a flush,
//!   the held bytes freed once written; `WriteState` without the socket.
//!   (A session keeps its socket whole and uses both halves borrowed.)
//!
//! permessage-deflate is the only extension, and no subprotocol is agreed.
//! Frames and messages (inflated, when compressed) are bounded by one
//! limit (twice `limits.max_message_bytes`, so that an oversized message
//! gets its NIP-01 answer from the session).

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod deflate;
pub mod extension;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod handshake;
pub mod metrics_names;
pub mod read;
pub mod send;

/// Close codes the relay sends (RFC 6455 section 7.4.1).
pub mod close_code {
    pub const NORMAL: u16 = 1000;
    pub const AWAY: u16 = 1001;
    pub const PROTOCOL: u16 = 1002;
    pub const INVALID_DATA: u16 = 1007;
    pub const SIZE: u16 = 1009;
}

/// A message from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(String),
    /// A binary message, by its length (the relay answers it with a NOTICE).
    Binary(usize),
    Ping(Vec<u8>),
    Close(Option<CloseFrame>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    pub code: u16,
    pub reason: String,
}

/// Why reading from a client failed.
#[derive(Debug)]
pub enum WsError {
    /// A frame or message over the bound.
    TooLarge,
    /// A text message (or a close reason) that is not UTF-8.
    BadUtf8,
    /// Against RFC 6455.
    Protocol(&'static str),
    Io(std::io::Error),
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WsError::TooLarge => f.write_str("frame over the size bound"),
            WsError::BadUtf8 => f.write_str("text that is not UTF-8"),
            WsError::Protocol(what) => write!(f, "protocol error: {what}"),
            WsError::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}
