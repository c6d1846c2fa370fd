//! The connection's outgoing half: every message the session sends goes
//! through [`Out`], and every send, feed and flush is bounded by
//! `server.send_timeout_ms`. A client that does not read within it is
//! disconnected as a slow consumer; it never stalls the relay for longer.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::SinkExt;
use futures_util::stream::SplitSink;

use crate::cork::{CorkSwitch, Corked};

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

pub(super) struct Out {
    sink: SplitSink<WebSocket, Message>,
    cork: CorkSwitch,
    timeout: Duration,
}

impl Out {
    pub(super) fn new(
        sink: SplitSink<WebSocket, Message>,
        cork: CorkSwitch,
        timeout: Duration,
    ) -> Out {
        Out {
            sink,
            cork,
            timeout,
        }
    }

    /// Holds what is fed back from the socket until the next flush, while
    /// the guard lives (`crate::cork`): a query chunk leaves in one write.
    pub(super) fn cork(&self) -> Corked {
        self.cork.close()
    }

    /// Sends one message and flushes.
    pub(super) async fn send(&mut self, text: String) -> Step {
        let sent = self.sink.send(Message::Text(text.into()));
        outcome(tokio::time::timeout(self.timeout, sent).await)
    }

    /// Queues a message without flushing (a chunk of events is flushed once).
    pub(super) async fn feed(&mut self, text: String) -> Step {
        let fed = self.sink.feed(Message::Text(text.into()));
        outcome(tokio::time::timeout(self.timeout, fed).await)
    }

    pub(super) async fn flush(&mut self) -> Step {
        outcome(tokio::time::timeout(self.timeout, self.sink.flush()).await)
    }

    /// Sends a close frame; the connection is ending, so errors (and a
    /// timeout) are moot.
    pub(super) async fn close(&mut self, code: u16, reason: &'static str) {
        let frame = Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }));
        let _ = tokio::time::timeout(self.timeout, self.sink.send(frame)).await;
    }
}

fn outcome(r: Result<Result<(), axum::Error>, tokio::time::error::Elapsed>) -> Step {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(CloseReason::IoError),
        Err(_) => Err(CloseReason::SlowConsumer),
    }
}
