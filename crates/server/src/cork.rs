//! A write cork for one TCP connection: while the session holds it closed
//! ([`CorkSwitch::close`]), the bytes written go to the socket together at
//! the next flush, in one `write(2)` per [`CORK_BYTES`], instead of one per
//! WebSocket frame.
//!
//! tungstenite writes every frame to its stream as soon as it is queued
//! (`server.write_buffer_bytes = 0`, which keeps its own per-connection buffer
//! small for good), so a query chunk of 50 events used to cost 50 `send`
//! calls, and on loopback each of them runs the receiver's TCP path too. The
//! session closes the cork while it writes a query chunk and flushes at its
//! end, so the chunk becomes one or a few writes. Everything else (HTTP
//! responses, OKs, live events, pongs, the closing handshake, which
//! tungstenite writes without a flush) goes straight through as before. The
//! buffer is freed when it has been written: an idle connection holds none.
//!
//! Bounded: at most [`CORK_BYTES`] are held; past that a write first drains
//! the buffer to the socket, and waits (backpressure, as the socket itself
//! would) while the socket does not take it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes held before they are written without waiting for a flush.
pub(crate) const CORK_BYTES: usize = 64 * 1024;

/// Opens and closes one connection's cork; shared by the connection's I/O
/// and its session (through the upgrade request's extensions).
#[derive(Clone, Default)]
pub(crate) struct CorkSwitch(Arc<AtomicBool>);

impl CorkSwitch {
    /// Holds writes back until the next flush, until the guard drops (on
    /// every exit path: a write after it goes straight through again).
    pub(crate) fn close(&self) -> Corked {
        self.0.store(true, Ordering::Relaxed);
        Corked(self.0.clone())
    }

    fn is_closed(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The cork held closed; dropping it opens it.
pub(crate) struct Corked(Arc<AtomicBool>);

impl Drop for Corked {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

pub(crate) struct Cork<T> {
    inner: T,
    switch: CorkSwitch,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to `inner`.
    written: usize,
}

impl<T> Cork<T> {
    pub(crate) fn new(inner: T) -> Cork<T> {
        Cork {
            inner,
            switch: CorkSwitch::default(),
            buf: Vec::new(),
            written: 0,
        }
    }

    pub(crate) fn switch(&self) -> CorkSwitch {
        self.switch.clone()
    }

    /// Bytes held, not yet written to the socket.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<T: AsyncWrite + Unpin> Cork<T> {
    /// Writes everything held; then frees the buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Cork<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Cork<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let corked = this.switch.is_closed();
        if !corked || this.buf.len() - this.written + data.len() > CORK_BYTES {
            // What is held goes first: bytes leave in the order written.
            ready!(this.poll_drain(cx))?;
            if !corked || data.len() >= CORK_BYTES {
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::Waker;

    /// A socket that takes at most `room` bytes until it is given more,
    /// and counts its writes.
    #[derive(Default)]
    struct Socket {
        got: Vec<u8>,
        writes: usize,
        room: usize,
        /// Writes return 0 (a socket that can take no more, ever).
        zero: bool,
        shut: bool,
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.zero {
                return Poll::Ready(Ok(0));
            }
            if self.room == 0 {
                return Poll::Pending;
            }
            let n = data.len().min(self.room);
            self.room -= n;
            self.writes += 1;
            self.got.extend_from_slice(&data[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    /// A cork over a socket that takes everything.
    fn roomy() -> Cork<Socket> {
        Cork::new(Socket {
            room: usize::MAX,
            ..Socket::default()
        })
    }

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    fn write(c: &mut Cork<Socket>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(&mut cx(), data)
    }

    fn flush(c: &mut Cork<Socket>) -> Poll<io::Result<()>> {
        Pin::new(c).poll_flush(&mut cx())
    }

    #[test]
    fn writes_between_flushes_reach_the_socket_in_one_write_and_the_buffer_is_freed() {
        let mut c = roomy();
        let corked = c.switch().close();
        for i in 0..50u8 {
            assert!(matches!(write(&mut c, &[i; 1000]), Poll::Ready(Ok(1000))));
        }
        assert_eq!(c.inner.writes, 0, "nothing is written before the flush");
        assert!(matches!(flush(&mut c), Poll::Ready(Ok(()))));
        assert_eq!(c.inner.writes, 1);
        let want: Vec<u8> = (0..50u8).flat_map(|i| [i; 1000]).collect();
        assert_eq!(c.inner.got, want);
        assert_eq!(c.buf.capacity(), 0, "an idle connection holds no buffer");
        drop(corked);
    }

    #[test]
    fn an_open_cork_writes_through_and_what_was_held_goes_first() {
        let mut c = roomy();
        assert!(matches!(write(&mut c, b"a"), Poll::Ready(Ok(1))));
        assert_eq!((c.inner.writes, c.held()), (1, 0), "open: straight through");
        {
            let _corked = c.switch().close();
            assert!(matches!(write(&mut c, b"b"), Poll::Ready(Ok(1))));
            assert_eq!(c.held(), 1);
        }
        // Opened without a flush (an early return): the next write, such as a
        // closing handshake that is never flushed, still reaches the socket.
        assert!(matches!(write(&mut c, b"c"), Poll::Ready(Ok(1))));
        assert_eq!(c.inner.got, b"abc");
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn past_the_bound_a_write_drains_first_and_large_writes_go_straight_through() {
        let mut c = roomy();
        let _corked = c.switch().close();
        let part = vec![7u8; CORK_BYTES / 2 + 1];
        assert!(matches!(write(&mut c, &part), Poll::Ready(Ok(_))));
        assert!(matches!(write(&mut c, &part), Poll::Ready(Ok(_))));
        assert_eq!(c.inner.writes, 1, "the first part was drained to make room");
        assert_eq!(c.held(), part.len());
        let big = vec![9u8; CORK_BYTES + 10];
        assert!(matches!(write(&mut c, &big), Poll::Ready(Ok(n)) if n == big.len()));
        assert_eq!(c.held(), 0);
        assert_eq!(c.inner.got.len(), 2 * part.len() + big.len());
        assert!(c.inner.got[2 * part.len()..].iter().all(|&b| b == 9));
    }

    #[test]
    fn a_socket_that_takes_nothing_holds_the_writer_back_at_the_bound() {
        let mut c = Cork::new(Socket::default());
        let _corked = c.switch().close();
        let part = vec![1u8; CORK_BYTES];
        assert!(matches!(write(&mut c, &part), Poll::Ready(Ok(_))));
        assert!(write(&mut c, &[2]).is_pending(), "full and blocked: wait");
        assert!(flush(&mut c).is_pending());
        assert!(c.held() <= CORK_BYTES, "never more than the bound");
        // The socket drains a little at a time; every byte arrives once, in order.
        c.inner.room = 1000;
        assert!(flush(&mut c).is_pending());
        c.inner.room = usize::MAX;
        assert!(matches!(write(&mut c, &[2]), Poll::Ready(Ok(1))));
        assert!(matches!(flush(&mut c), Poll::Ready(Ok(()))));
        assert_eq!(c.inner.got.len(), CORK_BYTES + 1);
        assert_eq!(c.inner.got.last(), Some(&2));
        assert_eq!(c.held(), 0);
    }

    fn shutdown(c: &mut Cork<Socket>) -> Poll<io::Result<()>> {
        Pin::new(c).poll_shutdown(&mut cx())
    }

    #[test]
    fn shutdown_writes_what_is_held_before_it_shuts_the_socket() {
        let mut c = Cork::new(Socket::default());
        let corked = c.switch().close();
        assert!(matches!(write(&mut c, b"last chunk"), Poll::Ready(Ok(10))));
        // The socket takes nothing yet: no shutdown ahead of the bytes.
        assert!(shutdown(&mut c).is_pending());
        assert!(!c.inner.shut);
        c.inner.room = usize::MAX;
        assert!(matches!(shutdown(&mut c), Poll::Ready(Ok(()))));
        assert!(c.inner.shut);
        assert_eq!(c.inner.got, b"last chunk");
        assert_eq!(c.buf.capacity(), 0);
        drop(corked);
    }

    #[test]
    fn a_socket_that_takes_zero_bytes_is_an_error_on_flush_and_shutdown() {
        let mut c = Cork::new(Socket {
            zero: true,
            ..Socket::default()
        });
        let _corked = c.switch().close();
        assert!(matches!(write(&mut c, b"x"), Poll::Ready(Ok(1))));
        let err = |p: Poll<io::Result<()>>| match p {
            Poll::Ready(Err(e)) => e.kind(),
            other => panic!("{other:?}"),
        };
        assert_eq!(err(flush(&mut c)), io::ErrorKind::WriteZero);
        assert_eq!(err(shutdown(&mut c)), io::ErrorKind::WriteZero);
        assert!(!c.inner.shut);
    }

    #[test]
    fn a_chunk_dropped_at_an_await_opens_the_cork() {
        let mut c = roomy();
        let switch = c.switch();
        // A chunk's writing, given up while it waits (a session ended by
        // shutdown or a lost client at an await point).
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut chunk = Box::pin(async move {
            let _corked = switch.close();
            let _ = rx.await;
        });
        assert!(chunk.as_mut().poll(&mut cx()).is_pending());
        assert!(c.switch().is_closed(), "held closed while the chunk runs");
        drop(chunk);
        assert!(!c.switch().is_closed(), "opened by the dropped guard");
        // The close frame after it goes straight to the socket.
        assert!(matches!(write(&mut c, b"close"), Poll::Ready(Ok(5))));
        assert_eq!((c.inner.writes, c.inner.got.as_slice()), (1, &b"close"[..]));
    }
}
