//! The incoming half: client messages read from the socket with no buffer
//! of the connection's own while it is idle.
//!
//! Bytes are read into a buffer of the worker thread, shared by every
//! connection it polls (`server.read_buffer_bytes`), and whole frames are
//! parsed there. Only what is left over (the start of a frame not yet
//! whole, or frames after the message returned) is copied into the
//! connection's `pending` bytes, which are read into directly until they
//! are used up and then freed. A fragmented message is assembled in a
//! buffer of its own, freed when the message is whole. Every buffer is
//! bounded by the frame limit.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

use crate::frame::{self, FrameFault, Header};
use crate::{CloseFrame, Message, WsError};

thread_local! {
    /// The worker thread's read buffer (see the module docs).
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A data message being assembled from fragments.
struct Partial {
    text: bool,
    /// Its first frame had RSV1: inflated once whole.
    compressed: bool,
    bytes: Vec<u8>,
}

/// Bytes read and not yet parsed (boxed: most connections have none, and
/// every connection's task holds the pointer).
struct Pending {
    bytes: Vec<u8>,
    /// Where the unparsed bytes begin.
    start: usize,
}

/// What parsing the start of some bytes gave.
enum Parsed {
    /// A message, and how many bytes it used.
    Message(Message, usize),
    /// A frame that is not a message by itself (a fragment, a Pong), and
    /// how many bytes it used.
    Used(usize),
    /// The frame at the start needs this many bytes in all.
    Need(usize),
}

/// A socket's incoming messages: [`ReadState`] over its own reader.
pub struct WsRead<R = OwnedReadHalf> {
    io: R,
    state: ReadState,
}

/// What reading a connection's messages keeps between them; the socket is
/// given to each call ([`ReadState::poll_next`]), so a connection can keep
/// its socket whole, read and written through borrowed halves.
pub struct ReadState {
    /// Bytes read and not yet parsed; no allocation when there are none.
    pending: Option<Box<Pending>>,
    partial: Option<Box<Partial>>,
    /// The frame and message bound.
    max_message: u32,
    /// Most bytes read from the socket at once.
    read_size: u32,
    /// A Close was received or the stream failed: nothing more is read.
    done: bool,
    /// permessage-deflate was agreed: messages may be compressed.
    deflate: bool,
}

impl<R: AsyncRead + Unpin> WsRead<R> {
    /// `already`: bytes the HTTP layer read past the upgrade request;
    /// `deflate`: permessage-deflate was agreed (a compressed message is
    /// bounded by `max_message` once inflated).
    pub fn new(
        io: R,
        already: &[u8],
        max_message: usize,
        read_size: usize,
        deflate: bool,
    ) -> WsRead<R> {
        WsRead {
            io,
            state: ReadState::new(already, max_message, read_size, deflate),
        }
    }

    /// The next message; `None` once the client closed (after its Close
    /// message), the stream ended, or an error was returned.
    // An async `next`, as a stream's: not `Iterator::next`.
    #[allow(clippy::should_implement_trait)]
    pub fn next(
        &mut self,
    ) -> impl std::future::Future<Output = Option<Result<Message, WsError>>> + '_ {
        self.state.next(&mut self.io)
    }

    /// Bytes this connection holds for incoming data (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.held()
    }
}

impl ReadState {
    /// As [`WsRead::new`], without the socket.
    pub fn new(already: &[u8], max_message: usize, read_size: usize, deflate: bool) -> ReadState {
        ReadState {
            pending: (!already.is_empty()).then(|| {
                Box::new(Pending {
                    bytes: already.to_vec(),
                    start: 0,
                })
            }),
            partial: None,
            max_message: u32::try_from(max_message).unwrap_or(u32::MAX),
            read_size: u32::try_from(read_size.max(frame::MAX_HEADER)).unwrap_or(u32::MAX),
            done: false,
            deflate,
        }
    }

    /// The next message read from `io`; `None` once the client closed
    /// (after its Close message), the stream ended, or an error was
    /// returned.
    pub fn next<'a, R: AsyncRead + Unpin>(
        &'a mut self,
        io: &'a mut R,
    ) -> impl std::future::Future<Output = Option<Result<Message, WsError>>> + 'a {
        poll_fn(move |cx| self.poll_next(io, cx))
    }

    /// Bytes this connection holds for incoming data (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.bytes.capacity())
            + self.partial.as_ref().map_or(0, |p| p.bytes.capacity())
    }

    /// [`ReadState::next`], polled.
    pub fn poll_next<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Message, WsError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(pending) = self.pending.as_mut() {
                let parsed = parse_frame(
                    &mut pending.bytes[pending.start..],
                    &mut self.partial,
                    self.max_message as usize,
                    self.deflate,
                );
                match parsed {
                    Err(e) => return Poll::Ready(Some(self.fail(e))),
                    Ok(Parsed::Message(msg, used)) => {
                        self.consume(used);
                        return Poll::Ready(Some(Ok(self.deliver(msg))));
                    }
                    Ok(Parsed::Used(used)) => {
                        self.consume(used);
                        continue;
                    }
                    Ok(Parsed::Need(total)) => {
                        // Keep only the frame's start, with room for all of it.
                        pending.bytes.drain(..pending.start);
                        pending.start = 0;
                        let want = total.max(pending.bytes.len() + 1);
                        pending.bytes.reserve_exact(want - pending.bytes.len());
                        let n = match ready!(self.read_into_pending(io, cx)) {
                            Ok(n) => n,
                            Err(e) => return Poll::Ready(Some(self.fail(WsError::Io(e)))),
                        };
                        if n == 0 {
                            return Poll::Ready(self.end_of_stream());
                        }
                        continue;
                    }
                }
            }
            // Nothing pending: read into the thread's buffer and parse there.
            return match self.poll_read_shared(io, cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(Some(msg))) => Poll::Ready(Some(Ok(self.deliver(msg)))),
                Poll::Ready(Ok(None)) => continue,
                Poll::Ready(Err(Eof)) => Poll::Ready(self.end_of_stream()),
                Poll::Ready(Err(Failed(e))) => Poll::Ready(Some(self.fail(e))),
            };
        }
    }

    /// Nothing more is read; what was held is freed.
    fn stop(&mut self) {
        self.done = true;
        self.pending = None;
        self.partial = None;
    }

    /// After a Close nothing more is read.
    fn deliver(&mut self, msg: Message) -> Message {
        if matches!(msg, Message::Close(_)) {
            self.stop();
        }
        msg
    }

    fn fail(&mut self, e: WsError) -> Result<Message, WsError> {
        self.stop();
        Err(e)
    }

    /// The socket ended without a Close: the stream ends.
    fn end_of_stream(&mut self) -> Option<Result<Message, WsError>> {
        self.stop();
        None
    }

    fn consume(&mut self, used: usize) {
        if let Some(pending) = self.pending.as_mut() {
            pending.start += used;
            if pending.start >= pending.bytes.len() {
                self.pending = None;
            }
        }
    }

    /// Reads into the spare room of `pending` (none: reads nothing).
    fn read_into_pending<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let Some(pending) = self.pending.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        let spare = pending.bytes.spare_capacity_mut();
        let room = spare.len().min((self.read_size as usize).max(1));
        let mut buf = ReadBuf::uninit(&mut spare[..room]);
        ready!(Pin::new(io).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        // SAFETY: `poll_read` initialised the first `n` spare bytes.
        unsafe { pending.bytes.set_len(pending.bytes.len() + n) };
        Poll::Ready(Ok(n))
    }

    /// Keeps `bytes` as the bytes read and not yet parsed.
    fn keep(&mut self, bytes: Vec<u8>) {
        self.pending = Some(Box::new(Pending { bytes, start: 0 }));
    }

    /// Reads once into the thread's buffer; returns the first message in
    /// what was read (`None`: none yet), keeping the rest in `pending`.
    fn poll_read_shared<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Message>, Stop>> {
        READ_BUF.with_borrow_mut(|shared| {
            if shared.len() < self.read_size as usize {
                shared.resize(self.read_size as usize, 0);
            }
            let mut buf = ReadBuf::new(&mut shared[..self.read_size as usize]);
            match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Failed(WsError::Io(e)))),
                Poll::Ready(Ok(())) => {}
            }
            let n = buf.filled().len();
            if n == 0 {
                return Poll::Ready(Err(Eof));
            }
            let bytes = &mut shared[..n];
            let mut at = 0;
            while at < n {
                match parse_frame(
                    &mut bytes[at..],
                    &mut self.partial,
                    self.max_message as usize,
                    self.deflate,
                ) {
                    Err(e) => return Poll::Ready(Err(Failed(e))),
                    Ok(Parsed::Used(used)) => at += used,
                    Ok(Parsed::Message(msg, used)) => {
                        at += used;
                        if at < n {
                            self.keep(bytes[at..].to_vec());
                        }
                        return Poll::Ready(Ok(Some(msg)));
                    }
                    Ok(Parsed::Need(total)) => {
                        let mut keep = Vec::with_capacity(total.max(n - at));
                        keep.extend_from_slice(&bytes[at..]);
                        self.keep(keep);
                        return Poll::Ready(Ok(None));
                    }
                }
            }
            Poll::Ready(Ok(None))
        })
    }
}

/// Why reading stopped without a message.
enum Stop {
    Eof,
    Failed(WsError),
}
use Stop::{Eof, Failed};

/// Parses the frame at the start of `bytes`, unmasking it in place.
fn parse_frame(
    bytes: &mut [u8],
    partial: &mut Option<Box<Partial>>,
    max_message: usize,
    deflate: bool,
) -> Result<Parsed, WsError> {
    let header: Header = match frame::parse_header(bytes, max_message, deflate) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(Parsed::Need(frame::MAX_HEADER.min(bytes.len() + 1).max(2))),
        Err(FrameFault::TooLarge) => return Err(WsError::TooLarge),
        Err(FrameFault::Protocol(what)) => return Err(WsError::Protocol(what)),
    };
    let total = header.frame_len();
    if bytes.len() < total {
        return Ok(Parsed::Need(total));
    }
    let payload = &mut bytes[header.header_len..total];
    frame::unmask(payload, header.mask);
    let payload = &*payload;
    let msg = match header.opcode {
        frame::PING => Message::Ping(payload.to_vec()),
        frame::PONG => return Ok(Parsed::Used(total)),
        frame::CLOSE => Message::Close(close_frame(payload)?),
        frame::TEXT | frame::BINARY => {
            if partial.is_some() {
                return Err(WsError::Protocol("a new message before the last one ended"));
            }
            let text = header.opcode == frame::TEXT;
            if !header.fin {
                *partial = Some(Box::new(Partial {
                    text,
                    compressed: header.compressed,
                    bytes: payload.to_vec(),
                }));
                return Ok(Parsed::Used(total));
            }
            if header.compressed {
                owned_message(text, crate::deflate::inflate(payload, max_message)?)?
            } else {
                data_message(text, payload)?
            }
        }
        _ => {
            // A continuation (the header check admits no other opcode).
            let Some(p) = partial.as_mut() else {
                return Err(WsError::Protocol("a continuation with no message begun"));
            };
            if p.bytes.len() + payload.len() > max_message {
                return Err(WsError::TooLarge);
            }
            p.bytes.extend_from_slice(payload);
            if !header.fin {
                return Ok(Parsed::Used(total));
            }
            let Some(p) = partial.take() else {
                return Err(WsError::Protocol("a continuation with no message begun"));
            };
            let bytes = if p.compressed {
                crate::deflate::inflate(&p.bytes, max_message)?
            } else {
                p.bytes
            };
            owned_message(p.text, bytes)?
        }
    };
    Ok(Parsed::Message(msg, total))
}

fn owned_message(text: bool, bytes: Vec<u8>) -> Result<Message, WsError> {
    if text {
        simdutf8::basic::from_utf8(&bytes).map_err(|_| WsError::BadUtf8)?;
        // SAFETY: checked just above.
        Ok(Message::Text(unsafe { String::from_utf8_unchecked(bytes) }))
    } else {
        Ok(Message::Binary(bytes.len()))
    }
}

fn data_message(text: bool, payload: &[u8]) -> Result<Message, WsError> {
    if text {
        let s = simdutf8::basic::from_utf8(payload).map_err(|_| WsError::BadUtf8)?;
        Ok(Message::Text(s.to_owned()))
    } else {
        Ok(Message::Binary(payload.len()))
    }
}

/// A Close frame's body: nothing, or a valid code and a UTF-8 reason.
fn close_frame(payload: &[u8]) -> Result<Option<CloseFrame>, WsError> {
    match payload {
        [] => Ok(None),
        [_] => Err(WsError::Protocol("a close frame of one byte")),
        [a, b, reason @ ..] => {
            let code = u16::from_be_bytes([*a, *b]);
            // RFC 6455 section 7.4, and 1012-1014 of the IANA registry (11.7).
            let valid = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
            if !valid {
                return Err(WsError::Protocol("an invalid close code"));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| WsError::BadUtf8)?;
            Ok(Some(CloseFrame {
                code,
                reason: reason.to_owned(),
            }))
        }
    }
}

#[cfg(test)]
mod differential;
#[cfg(test)]
mod tests;
