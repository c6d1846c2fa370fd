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
