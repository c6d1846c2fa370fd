//! The outgoing half: frames the relay sends, with no buffer of the
//! connection's own while it is idle.
//!
//! - [`WsWrite::send`] writes a frame at once: header and payload go to
//!   the socket in one vectored write, copied nowhere when the socket takes
//!   them (the usual case); what it does not take is kept and written
//!   before `send` returns.
//! - [`WsWrite::feed`] holds frames until the next flush (a query chunk's
//!   events leave in one write instead of one per event), at most
//!   `server.write_buffer_bytes` (and never past
//!   `server.max_write_buffer_bytes` with the new frame): past that the
//!   held bytes are written first.
//! - The held bytes are freed once written.
//!
//! Every operation may wait for the socket; the session bounds each by
//! `server.send_timeout_ms` (a client that does not read is a slow
//! consumer).

use std::io::{self, IoSlice};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;

use super::frame;

/// A socket the writer can also try without waiting.
pub(crate) trait TryWrite: AsyncWrite + Unpin {
    /// Writes what the socket takes now (`WouldBlock`: nothing).
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

impl TryWrite for OwnedWriteHalf {
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        OwnedWriteHalf::try_write_vectored(self, bufs)
    }
}

pub(crate) struct WsWrite<W = OwnedWriteHalf> {
    io: W,
    /// Frames not yet written, from `sent`; no allocation when empty.
    held: Vec<u8>,
    sent: usize,
    /// `feed` writes what is held first once this much is held.
    hold_bytes: u32,
    /// ... or when the new frame would take what is held past this.
    max_held: u32,
}

impl<W: TryWrite> WsWrite<W> {
    pub(crate) fn new(io: W, hold_bytes: usize, max_held: usize) -> WsWrite<W> {
        WsWrite {
            io,
            held: Vec::new(),
            sent: 0,
            hold_bytes: u32::try_from(hold_bytes).unwrap_or(u32::MAX),
            max_held: u32::try_from(max_held).unwrap_or(u32::MAX),
        }
    }

    /// Bytes held (for tests).
    #[cfg(test)]
    pub(crate) fn held_capacity(&self) -> usize {
        self.held.capacity()
    }

    /// Writes a text message now (with whatever was held before it).
    #[cfg(test)]
    pub(crate) async fn send(&mut self, text: &str) -> io::Result<()> {
        self.send_frame(frame::TEXT, text.as_bytes()).await
    }

    /// Holds a text message until the next flush (see the module docs).
    pub(crate) async fn feed(&mut self, text: &str) -> io::Result<()> {
        if self.must_flush_to_feed(text) {
            self.flush().await?;
        }
        if self.hold_bytes == 0 {
            return self.send_frame(frame::TEXT, text.as_bytes()).await;
        }
        self.hold_text(text);
        Ok(())
    }

    /// Whether what is held must be written before `text` is fed.
    pub(crate) fn must_flush_to_feed(&self, text: &str) -> bool {
        let held = self.held.len() - self.sent;
        held > 0
            && (held >= self.hold_bytes as usize
                || held + text.len() + frame::MAX_HEADER > self.max_held as usize)
    }

    /// Holds a text message without writing anything (see
    /// [`WsWrite::feed`], which bounds what is held).
    pub(crate) fn hold_text(&mut self, text: &str) {
        self.hold(frame::TEXT, text.as_bytes());
    }

    /// Whether `feed` holds frames at all (`server.write_buffer_bytes` > 0).
    pub(crate) fn holds(&self) -> bool {
        self.hold_bytes > 0
    }

    /// Nothing is held.
    pub(crate) fn is_flushed(&self) -> bool {
        self.held.is_empty()
    }

    /// Writes what is held.
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        while self.sent < self.held.len() {
            let n = self.io.write(&self.held[self.sent..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.sent += n;
        }
        self.held = Vec::new();
        self.sent = 0;
        self.io.flush().await
    }

    /// Sends a Close frame with this code and reason (at most 123 bytes).
    pub(crate) async fn close(&mut self, code: u16, reason: &str) -> io::Result<()> {
        let mut body = Vec::with_capacity(2 + reason.len());
        body.extend_from_slice(&code.to_be_bytes());
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        body.extend_from_slice(&reason.as_bytes()[..end]);
        self.send_frame(frame::CLOSE, &body).await
    }

    /// Answers a Ping.
    pub(crate) async fn pong(&mut self, payload: &[u8]) -> io::Result<()> {
        self.send_frame(frame::PONG, payload).await
    }

    async fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        if self.try_send_frame(opcode, payload)? {
            return Ok(());
        }
        self.flush().await
    }

    /// Writes a text message if the socket takes all of it now (true);
    /// else what it did not take is held, and the caller must
    /// [`WsWrite::flush`] before the message counts as sent.
    pub(crate) fn try_send(&mut self, text: &str) -> io::Result<bool> {
        self.try_send_frame(frame::TEXT, text.as_bytes())
    }

    fn try_send_frame(&mut self, opcode: u8, payload: &[u8]) -> io::Result<bool> {
        if !self.held.is_empty() {
            self.hold(opcode, payload);
            return Ok(false);
        }
        let (h, n) = frame::server_header(opcode, payload.len());
        let header = &h[..n];
        let total = n + payload.len();
        let taken = match self
            .io
            .try_write_vectored(&[IoSlice::new(header), IoSlice::new(payload)])
        {
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        if taken == total {
            return Ok(true);
        }
        // Keep what the socket did not take.
        let mut rest = Vec::with_capacity(total - taken);
        if taken < n {
            rest.extend_from_slice(&header[taken..]);
            rest.extend_from_slice(payload);
        } else {
            rest.extend_from_slice(&payload[taken - n..]);
        }
        self.held = rest;
        self.sent = 0;
        Ok(false)
    }

    fn hold(&mut self, opcode: u8, payload: &[u8]) {
        let (h, n) = frame::server_header(opcode, payload.len());
        self.held.reserve(n + payload.len());
        self.held.extend_from_slice(&h[..n]);
        self.held.extend_from_slice(payload);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    const HOLD: usize = 64 * 1024;

    /// A writer over a socket that takes at most `room` bytes per call.
    fn writer(room: usize, hold: usize, max_held: usize) -> WsWrite<Socket> {
        WsWrite::new(
            Socket {
                room,
                ..Socket::default()
            },
            hold,
            max_held,
        )
    }

    /// A socket that takes at most `room` bytes per call, counting calls.
    #[derive(Default)]
    struct Socket {
        data: Vec<u8>,
        room: usize,
        writes: usize,
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.room);
            self.data.extend_from_slice(&buf[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl TryWrite for Socket {
        fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.writes += 1;
            let mut left = self.room;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(left);
                self.data.extend_from_slice(&b[..k]);
                left -= k;
                n += k;
            }
            if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        }
    }

    fn frames(mut data: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let op = data[0] & 0x0F;
            assert!(
                data[0] & 0x80 != 0 && data[1] & 0x80 == 0,
                "final, unmasked"
            );
            let (len, at) = match data[1] {
                126 => (u16::from_be_bytes([data[2], data[3]]) as usize, 4),
                127 => (
                    u64::from_be_bytes(data[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                n => (n as usize, 2),
            };
            out.push((op, data[at..at + len].to_vec()));
            data = &data[at + len..];
        }
        out
    }

    #[tokio::test]
    async fn a_send_the_socket_takes_is_one_write_and_holds_nothing() {
        let mut w = writer(usize::MAX, HOLD, 4 << 20);
        w.send("hello").await.unwrap();
        w.send(&"y".repeat(70_000)).await.unwrap();
        assert_eq!(w.io.writes, 2);
        assert_eq!(w.held_capacity(), 0);
        let f = frames(&w.io.data);
        assert_eq!(f[0], (frame::TEXT, b"hello".to_vec()));
        assert_eq!(f[1].1.len(), 70_000);
    }

    #[tokio::test]
    async fn what_a_slow_socket_does_not_take_is_written_before_send_returns() {
        for room in [1, 3, 7, 100] {
            let mut w = writer(room, HOLD, 4 << 20);
            w.send("abcdefghij").await.unwrap();
            w.close(1001, "bye").await.unwrap();
            w.pong(b"p").await.unwrap();
            assert_eq!(w.held_capacity(), 0);
            assert_eq!(
                frames(&w.io.data),
                vec![
                    (frame::TEXT, b"abcdefghij".to_vec()),
                    (frame::CLOSE, [&1001u16.to_be_bytes()[..], b"bye"].concat()),
                    (frame::PONG, b"p".to_vec()),
                ]
            );
        }
    }

    #[tokio::test]
    async fn fed_frames_leave_together_at_the_flush_and_the_buffer_is_freed() {
        let mut w = writer(usize::MAX, HOLD, 4 << 20);
        for i in 0..50 {
            w.feed(&format!("event {i}")).await.unwrap();
        }
        assert_eq!(w.io.writes, 0, "nothing written before the flush");
        w.flush().await.unwrap();
        assert_eq!(w.io.writes, 1);
        assert_eq!(w.held_capacity(), 0);
        assert_eq!(frames(&w.io.data).len(), 50);
        // A send after feeds writes them first, in order.
        w.feed("a").await.unwrap();
        w.send("b").await.unwrap();
        let f = frames(&w.io.data);
        assert_eq!(
            f[50..],
            [(frame::TEXT, b"a".to_vec()), (frame::TEXT, b"b".to_vec())]
        );
    }

    #[tokio::test]
    async fn feeding_past_the_bound_writes_what_is_held_first() {
        let mut w = writer(usize::MAX, HOLD, 4 << 20);
        let event = "e".repeat(10_000);
        for _ in 0..20 {
            w.feed(&event).await.unwrap();
            assert!(w.held.len() - w.sent <= HOLD + 10_000 + 10);
        }
        assert!(w.io.writes >= 2, "written in bounded pieces");
        w.flush().await.unwrap();
        assert_eq!(frames(&w.io.data).len(), 20);
    }

    #[tokio::test]
    async fn nothing_is_held_past_the_hard_bound_and_zero_holds_nothing() {
        let mut w = writer(usize::MAX, HOLD, 25_000);
        let event = "e".repeat(10_000);
        for _ in 0..10 {
            w.feed(&event).await.unwrap();
            assert!(w.held.len() - w.sent <= 25_000, "{}", w.held.len());
        }
        let mut w = writer(usize::MAX, 0, 4 << 20);
        w.feed("a").await.unwrap();
        assert_eq!(w.io.writes, 1, "written at once");
        assert_eq!(w.held_capacity(), 0);
    }

    #[tokio::test]
    async fn a_socket_that_takes_nothing_is_an_error_not_a_spin() {
        let mut w = writer(0, HOLD, 4 << 20);
        assert!(w.send("x").await.is_err());
    }

    #[tokio::test]
    async fn close_reasons_are_cut_at_a_character_boundary() {
        let mut w = writer(usize::MAX, HOLD, 4 << 20);
        w.close(1000, &"é".repeat(100)).await.unwrap();
        let f = frames(&w.io.data);
        assert!(f[0].1.len() <= 125);
        std::str::from_utf8(&f[0].1[2..]).unwrap();
    }
}
