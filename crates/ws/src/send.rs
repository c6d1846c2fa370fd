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
//! - Once written, the held buffer is the thread's again (it keeps at
//!   most two, of at most 1 MiB each, for the next connection it holds
//!   frames for): an idle connection holds none.
//!
//! - With permessage-deflate agreed, a text message of at least
//!   `server.compression_min_bytes` is compressed ([`Deflater`]) into the
//!   worker thread's scratch buffer, then sent the same way; a message
//!   given in parts ([`WsWrite::try_send_event`]) is never joined first.
//!
//! Every operation may wait for the socket; the session bounds each by
//! `server.send_timeout_ms` (a client that does not read is a slow
//! consumer).

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::sync::OnceLock;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedWriteHalf, WriteHalf};

use crate::deflate::Deflater;
use crate::frame;

thread_local! {
    /// The worker thread's buffer for a compressed message on its way out.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Held frames' buffers once written, kept for the next connection
    /// this thread holds frames for: a query chunk's frames grew a fresh
    /// buffer from 16 KiB by doubling and freed it at the write, copying
    /// its bytes once more than the frames themselves.
    static SPARE_HELD: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Held buffers one thread keeps at most, and the largest it keeps.
const SPARE_HELD_KEPT: usize = 2;
const SPARE_HELD_MAX: usize = 1 << 20;

/// An empty buffer for held frames: a spare of this thread, or a new one
/// of `capacity`.
fn held_buffer(capacity: usize) -> Vec<u8> {
    SPARE_HELD
        .with_borrow_mut(|spare| spare.pop())
        .unwrap_or_else(|| Vec::with_capacity(capacity))
}

/// A held buffer written out: kept as a spare of this thread (one with
/// room for a chunk's first frames, not an outsized one), or freed.
fn give_back(mut bytes: Vec<u8>) {
    if bytes.capacity() < HOLD_START || bytes.capacity() > SPARE_HELD_MAX {
        return;
    }
    bytes.clear();
    SPARE_HELD.with_borrow_mut(|spare| {
        if spare.len() < SPARE_HELD_KEPT {
            spare.push(bytes);
        }
    });
}

/// Where a message's shared part keeps its compressed form, if it has one.
type Shared<'a> = Option<&'a OnceLock<Box<[u8]>>>;

/// A scratch buffer grown past this is freed after its message.
const SCRATCH_KEPT: usize = 1 << 20;
/// The room a fresh run of held frames starts with (at most `hold_bytes`).
const HOLD_START: usize = 16 << 10;

/// A socket the writer can also try without waiting.
pub trait TryWrite: AsyncWrite + Unpin {
    /// Writes what the socket takes now (`WouldBlock`: nothing).
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
}

impl TryWrite for OwnedWriteHalf {
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        OwnedWriteHalf::try_write_vectored(self, bufs)
    }
}

impl TryWrite for WriteHalf<'_> {
    fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        WriteHalf::try_write_vectored(self, bufs)
    }
}

/// Frames not yet written (boxed: most connections hold none, and every
/// connection's task holds the pointer).
struct Held {
    bytes: Vec<u8>,
    /// How many of `bytes` are written.
    sent: usize,
}

/// A socket's outgoing frames: [`WriteState`] over its own writer.
pub struct WsWrite<W = OwnedWriteHalf> {
    io: W,
    state: WriteState,
}

/// What writing a connection's frames keeps between them; the socket is
/// given to each call, so a connection can keep its socket whole, read and
/// written through borrowed halves.
pub struct WriteState {
    /// Frames not yet written; no allocation when there are none.
    held: Option<Box<Held>>,
    /// `feed` writes what is held first once this much is held.
    hold_bytes: u32,
    /// ... or when the new frame would take what is held past this.
    max_held: u32,
    /// permessage-deflate, when agreed.
    deflate: Option<Box<Deflater>>,
}

impl<W: TryWrite> WsWrite<W> {
    pub fn new(io: W, hold_bytes: usize, max_held: usize, deflate: Option<Deflater>) -> WsWrite<W> {
        WsWrite {
            io,
            state: WriteState::new(hold_bytes, max_held, deflate),
        }
    }

    /// Bytes held (for tests).
    #[cfg(test)]
    pub fn held_capacity(&self) -> usize {
        self.state.held_capacity()
    }

    /// Bytes held and not yet written (for tests).
    #[cfg(test)]
    fn unsent(&self) -> usize {
        self.state.unsent()
    }

    /// Writes a text message now (with whatever was held before it).
    #[cfg(test)]
    pub async fn send(&mut self, text: &str) -> io::Result<()> {
        self.state.send(&mut self.io, text).await
    }

    /// [`WriteState::feed`].
    pub async fn feed(&mut self, text: &str) -> io::Result<()> {
        self.state.feed(&mut self.io, text).await
    }

    /// [`WriteState::flush`].
    pub async fn flush(&mut self) -> io::Result<()> {
        self.state.flush(&mut self.io).await
    }

    /// [`WriteState::close`].
    pub async fn close(&mut self, code: u16, reason: &str) -> io::Result<()> {
        self.state.close(&mut self.io, code, reason).await
    }

    /// [`WriteState::pong`].
    pub async fn pong(&mut self, payload: &[u8]) -> io::Result<()> {
        self.state.pong(&mut self.io, payload).await
    }

    /// [`WriteState::try_send`].
    pub fn try_send(&mut self, text: &str) -> io::Result<bool> {
        self.state.try_send(&mut self.io, text)
    }

    /// [`WriteState::try_send_event`].
    pub fn try_send_event(
        &mut self,
        prefix: &str,
        body: &str,
        suffix: &str,
        shared: &OnceLock<Box<[u8]>>,
    ) -> io::Result<bool> {
        self.state
            .try_send_event(&mut self.io, prefix, body, suffix, shared)
    }
}

impl WriteState {
    /// As [`WsWrite::new`], without the socket.
    pub fn new(hold_bytes: usize, max_held: usize, deflate: Option<Deflater>) -> WriteState {
        WriteState {
            held: None,
            hold_bytes: u32::try_from(hold_bytes).unwrap_or(u32::MAX),
            max_held: u32::try_from(max_held).unwrap_or(u32::MAX),
            deflate: deflate.map(Box::new),
        }
    }

    /// Bytes held (for tests).
    #[cfg(test)]
    pub fn held_capacity(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.bytes.capacity())
    }

    /// Bytes held and not yet written (for tests).
    #[cfg(test)]
    fn unsent(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.bytes.len() - h.sent)
    }

    /// Writes a text message now (with whatever was held before it).
    #[cfg(test)]
    pub async fn send<W: TryWrite>(&mut self, io: &mut W, text: &str) -> io::Result<()> {
        if self.try_send(io, text)? {
            return Ok(());
        }
        self.flush(io).await
    }

    /// Holds a text message until the next flush (see the module docs).
    pub async fn feed<W: TryWrite>(&mut self, io: &mut W, text: &str) -> io::Result<()> {
        if self.must_flush_to_feed(text) {
            self.flush(io).await?;
        }
        if self.hold_bytes == 0 {
            if self.try_send(io, text)? {
                return Ok(());
            }
            return self.flush(io).await;
        }
        self.hold_text(text);
        Ok(())
    }

    /// Whether what is held must be written before `text` is fed.
    pub fn must_flush_to_feed(&self, text: &str) -> bool {
        self.must_flush_to_feed_len(text.len())
    }

    /// [`WriteState::must_flush_to_feed`] of a message `len` bytes long.
    pub fn must_flush_to_feed_len(&self, len: usize) -> bool {
        let held = self.held.as_ref().map_or(0, |h| h.bytes.len() - h.sent);
        held > 0
            && (held >= self.hold_bytes as usize
                || held + len + frame::MAX_HEADER > self.max_held as usize)
    }

    /// Holds a text message without writing anything (see
    /// [`WsWrite::feed`], which bounds what is held).
    pub fn hold_text(&mut self, text: &str) {
        self.hold_message(&[text.as_bytes()], None);
    }

    /// [`WriteState::hold_text`] of the text `prefix + body + suffix`,
    /// never joined (a query chunk's events: one copy each, into the
    /// frames held for the chunk's one write).
    pub fn hold_event(&mut self, prefix: &str, body: &str, suffix: &str) {
        if self.held.is_none() {
            // A query chunk's events, fed one by one: room for several of
            // them at once, not a reallocation per event. (A lone EOSE or
            // OK held takes a spare only if the thread has one.)
            self.held = Some(Box::new(Held {
                bytes: held_buffer((self.hold_bytes as usize).min(HOLD_START)),
                sent: 0,
            }));
        }
        self.hold_message(
            &[prefix.as_bytes(), body.as_bytes(), suffix.as_bytes()],
            None,
        );
    }

    /// Whether `feed` holds frames at all (`server.write_buffer_bytes` > 0).
    pub fn holds(&self) -> bool {
        self.hold_bytes > 0
    }

    /// Nothing is held.
    pub fn is_flushed(&self) -> bool {
        self.held.is_none()
    }

    /// Writes what is held.
    pub async fn flush<W: TryWrite>(&mut self, io: &mut W) -> io::Result<()> {
        if let Some(held) = self.held.as_mut() {
            while held.sent < held.bytes.len() {
                let n = io.write(&held.bytes[held.sent..]).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                held.sent += n;
            }
        }
        if let Some(held) = self.held.take() {
            give_back(held.bytes);
        }
        io.flush().await
    }

    /// Sends a Close frame with this code and reason (at most 123 bytes).
    pub async fn close<W: TryWrite>(
        &mut self,
        io: &mut W,
        code: u16,
        reason: &str,
    ) -> io::Result<()> {
        let mut body = Vec::with_capacity(2 + reason.len());
        body.extend_from_slice(&code.to_be_bytes());
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        body.extend_from_slice(&reason.as_bytes()[..end]);
        self.send_frame(io, frame::CLOSE, &body).await
    }

    /// Answers a Ping.
    pub async fn pong<W: TryWrite>(&mut self, io: &mut W, payload: &[u8]) -> io::Result<()> {
        self.send_frame(io, frame::PONG, payload).await
    }

    async fn send_frame<W: TryWrite>(
        &mut self,
        io: &mut W,
        opcode: u8,
        payload: &[u8],
    ) -> io::Result<()> {
        if self.try_send_frame(io, opcode, &[payload])? {
            return Ok(());
        }
        self.flush(io).await
    }

    /// Writes a text message if the socket takes all of it now (true);
    /// else what it did not take is held, and the caller must
    /// [`WsWrite::flush`] before the message counts as sent.
    pub fn try_send<W: TryWrite>(&mut self, io: &mut W, text: &str) -> io::Result<bool> {
        self.try_send_message(io, &[text.as_bytes()], None)
    }

    /// [`WsWrite::try_send`] of the text `prefix + body + suffix`, never
    /// joined: `body` is shared by many messages (a live event's JSON),
    /// and `shared` is kept with it, so that compressing each message on
    /// its own compresses `body` once.
    pub fn try_send_event<W: TryWrite>(
        &mut self,
        io: &mut W,
        prefix: &str,
        body: &str,
        suffix: &str,
        shared: &OnceLock<Box<[u8]>>,
    ) -> io::Result<bool> {
        let parts = [prefix.as_bytes(), body.as_bytes(), suffix.as_bytes()];
        self.try_send_message(io, &parts, Some(shared))
    }

    /// A text message made of `parts`, compressed when agreed and long
    /// enough.
    fn try_send_message<W: TryWrite>(
        &mut self,
        io: &mut W,
        parts: &[&[u8]],
        key: Shared<'_>,
    ) -> io::Result<bool> {
        if !self.compresses(parts) {
            return self.try_send_frame(io, frame::TEXT, parts);
        }
        SCRATCH.with_borrow_mut(|z| {
            self.compress(parts, key, z);
            let sent = self.try_send_frame(io, frame::TEXT | frame::RSV1, &[&z[..]]);
            release(z);
            sent
        })
    }

    fn hold_message(&mut self, parts: &[&[u8]], key: Shared<'_>) {
        if !self.compresses(parts) {
            return self.hold(frame::TEXT, parts);
        }
        SCRATCH.with_borrow_mut(|z| {
            self.compress(parts, key, z);
            self.hold(frame::TEXT | frame::RSV1, &[&z[..]]);
            release(z);
        });
    }

    fn compresses(&self, parts: &[&[u8]]) -> bool {
        self.deflate
            .as_ref()
            .is_some_and(|d| d.wants(parts.iter().map(|p| p.len()).sum()))
    }

    /// The compressed payload of `parts` into `out` (cleared first).
    fn compress(&mut self, parts: &[&[u8]], key: Shared<'_>, out: &mut Vec<u8>) {
        out.clear();
        let Some(d) = self.deflate.as_deref_mut() else {
            return;
        };
        match (key, parts) {
            (Some(key), [prefix, body, suffix]) if d.splices() => {
                d.spliced(prefix, body, key, suffix, out)
            }
            _ => d.compress(parts, out),
        }
    }

    fn try_send_frame<W: TryWrite>(
        &mut self,
        io: &mut W,
        opcode: u8,
        parts: &[&[u8]],
    ) -> io::Result<bool> {
        if self.held.is_some() {
            self.hold(opcode, parts);
            return Ok(false);
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (h, n) = frame::server_header(opcode, len);
        let header = &h[..n];
        let total = n + len;
        let mut slices = [IoSlice::new(&[]); 4];
        slices[0] = IoSlice::new(header);
        for (slot, part) in slices[1..].iter_mut().zip(parts) {
            *slot = IoSlice::new(part);
        }
        let used = 1 + parts.len().min(3);
        let taken = match io.try_write_vectored(&slices[..used]) {
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        if taken == total {
            return Ok(true);
        }
        // Keep what the socket did not take.
        let mut rest = Vec::with_capacity(total - taken);
        let mut skip = taken;
        for piece in std::iter::once(header).chain(parts.iter().copied()) {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            rest.extend_from_slice(&piece[skip..]);
            skip = 0;
        }
        self.held = Some(Box::new(Held {
            bytes: rest,
            sent: 0,
        }));
        Ok(false)
    }

    fn hold(&mut self, opcode: u8, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (h, n) = frame::server_header(opcode, len);
        let held = &mut self
            .held
            .get_or_insert_with(|| {
                Box::new(Held {
                    bytes: held_buffer(0),
                    sent: 0,
                })
            })
            .bytes;
        held.reserve(n + len);
        held.extend_from_slice(&h[..n]);
        for part in parts {
            held.extend_from_slice(part);
        }
    }
}

/// Frees a scratch buffer a large message grew.
fn release(z: &mut Vec<u8>) {
    if z.capacity() > SCRATCH_KEPT {
        *z = Vec::new();
    }
}

#[cfg(test)]
mod tests;
