//! The connection's outgoing half: every message the session sends goes
//! through [`Out`], and every send, feed and flush is bounded by
//! `server.send_timeout_ms`. A client that does not read within it is
//! disconnected as a slow consumer; it never stalls the relay for longer.
//!
//! The socket is kept whole ([`Socket`]) and written through a borrowed
//! half: [`Out`] is made for each handler from the connection's
//! [`OutState`] and that half.

use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use sluice_ws::send::WriteState;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::net::tcp::WriteHalf;

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CloseReason {
    /// The client sent a Close, or its stream ended.
    ClientClosed,
    /// The relay is shutting down.
    Shutdown,
    /// Its live queue filled, or a send did not finish within
    /// `server.send_timeout_ms`.
    SlowConsumer,
    /// A frame over the WebSocket layer's hard bound.
    MessageTooLarge,
    /// A WebSocket protocol error.
    ProtocolError,
    /// A send failed.
    IoError,
    /// Nothing open and nothing sent for `server.idle_timeout_ms`.
    Idle,
}

impl CloseReason {
    /// The `reason` label of `sluice_connections_closed_total`.
    pub(super) fn label(self) -> &'static str {
        match self {
            CloseReason::ClientClosed => "client_closed",
            CloseReason::Shutdown => "shutdown",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::MessageTooLarge => "message_too_large",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::IoError => "io_error",
            CloseReason::Idle => "idle",
        }
    }
}

/// What a handler returns: `Err` ends the connection.
pub(super) type Step = Result<(), CloseReason>;

/// A connection's socket, read and written through borrowed halves (no
/// `Arc` split). Dropped, it is shut for writing before it closes, so the
/// client reads the end of the stream before the close.
pub(super) struct Socket(pub(super) TcpStream);

impl Drop for Socket {
    fn drop(&mut self) {
        // A TCP stream's shutdown is done at once (never pending).
        let _ = Pin::new(&mut self.0).poll_shutdown(&mut Context::from_waker(Waker::noop()));
    }
}

/// What the outgoing half keeps between handlers.
pub(super) struct OutState {
    ws: WriteState,
    /// The bound on each send, in milliseconds (4 bytes, not a `Duration`'s
    /// 16, in every connection's task).
    timeout_ms: u32,
}

impl OutState {
    pub(super) fn new(ws: WriteState, timeout: Duration) -> OutState {
        OutState {
            ws,
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
        }
    }

    /// The outgoing half over `io`, the socket's write half.
    pub(super) fn bind<'a>(&'a mut self, io: WriteHalf<'a>) -> Out<'a> {
        Out {
            ws: &mut self.ws,
            io,
            timeout_ms: self.timeout_ms,
        }
    }
}

/// The outgoing half while a handler runs.
pub(super) struct Out<'a> {
    ws: &'a mut WriteState,
    io: WriteHalf<'a>,
    timeout_ms: u32,
}

impl Out<'_> {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.into())
    }

    /// Sends one message now. When the socket takes it at once (the usual
    /// case) nothing waits, and the waiting path is boxed: every handler's
    /// future, held by the connection's task, stays small.
    pub(super) async fn send(&mut self, text: String) -> Step {
        match self.ws.try_send(&mut self.io, &text) {
            Ok(true) => Ok(()),
            Ok(false) => Box::pin(self.flush()).await,
            Err(_) => Err(CloseReason::IoError),
        }
    }

    /// Sends `prefix`, then the event's JSON `raw` and `]`, as one message
    /// without joining them (`sluice_ws::send::WsWrite::try_send_event`: a live
    /// event's JSON is compressed once for all its subscribers when each
    /// message is compressed on its own).
    pub(super) async fn send_event(
        &mut self,
        prefix: &str,
        raw: &str,
        shared: &std::sync::OnceLock<Box<[u8]>>,
    ) -> Step {
        match self
            .ws
            .try_send_event(&mut self.io, prefix, raw, "]", shared)
        {
            Ok(true) => Ok(()),
            Ok(false) => Box::pin(self.flush()).await,
            Err(_) => Err(CloseReason::IoError),
        }
    }

    /// Holds a message until the next flush or send (a query chunk's
    /// events leave in one write; `sluice_ws::send::WsWrite::feed`).
    pub(super) async fn feed(&mut self, text: String) -> Step {
        if !self.ws.must_flush_to_feed(&text) && self.ws.holds() {
            self.ws.hold_text(&text);
            return Ok(());
        }
        let timeout = self.timeout();
        Box::pin(async {
            outcome(tokio::time::timeout(timeout, self.ws.feed(&mut self.io, &text)).await)
        })
        .await
    }

    /// [`Out::feed`] of `prefix`, the event's JSON `raw` and `]`, held
    /// without joining them first (a query chunk's events).
    pub(super) async fn feed_event(&mut self, prefix: &str, raw: &str) -> Step {
        let len = prefix.len() + raw.len() + 1;
        if !self.ws.must_flush_to_feed_len(len) && self.ws.holds() {
            self.ws.hold_event(prefix, raw, "]");
            return Ok(());
        }
        let mut text = String::with_capacity(len);
        text.push_str(prefix);
        text.push_str(raw);
        text.push(']');
        Box::pin(self.feed(text)).await
    }

    pub(super) async fn flush(&mut self) -> Step {
        if self.ws.is_flushed() {
            return Ok(());
        }
        outcome(tokio::time::timeout(self.timeout(), self.ws.flush(&mut self.io)).await)
    }

    /// Answers a client's Ping.
    pub(super) async fn pong(&mut self, payload: &[u8]) -> Step {
        outcome(tokio::time::timeout(self.timeout(), self.ws.pong(&mut self.io, payload)).await)
    }

    /// Sends a Close frame; the connection is ending, so errors (and a
    /// timeout) are moot.
    pub(super) async fn close(&mut self, code: u16, reason: &str) {
        let _ =
            tokio::time::timeout(self.timeout(), self.ws.close(&mut self.io, code, reason)).await;
    }
}

fn outcome(r: Result<std::io::Result<()>, tokio::time::error::Elapsed>) -> Step {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(CloseReason::IoError),
        Err(_) => Err(CloseReason::SlowConsumer),
    }
}
