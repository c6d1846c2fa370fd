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
        None,
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
        assert!(w.unsent() <= HOLD + 10_000 + 10);
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
        assert!(w.unsent() <= 25_000, "{}", w.unsent());
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

fn deflating(room: usize, stateless: bool) -> WsWrite<Socket> {
    let agreed = crate::extension::Agreed {
        server_no_context: stateless,
        server_window_bits: 15,
    };
    let settings = crate::deflate::DeflateSettings {
        level: 6,
        min_bytes: 16,
        window_bytes: 4096,
    };
    let budget = crate::deflate::WindowBudget::new(1 << 20);
    WsWrite::new(
        Socket {
            room,
            ..Socket::default()
        },
        HOLD,
        4 << 20,
        Some(Deflater::new(agreed, settings, budget)),
    )
}

/// Each frame's first byte and payload, inflated when RSV1 is set (one
/// inflater across messages: context takeover).
fn inflated(data: &[u8]) -> Vec<(u8, String)> {
    let mut d = flate2::Decompress::new(false);
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let b0 = data[at];
        let (len, h) = match data[at + 1] {
            126 => (u16::from_be_bytes([data[at + 2], data[at + 3]]) as usize, 4),
            n => (n as usize, 2),
        };
        let mut payload = data[at + h..at + h + len].to_vec();
        at += h + len;
        if b0 & frame::RSV1 != 0 {
            payload.extend_from_slice(&[0, 0, 0xff, 0xff]);
            let mut text = Vec::with_capacity(1 << 16);
            d.decompress_vec(&payload, &mut text, flate2::FlushDecompress::Sync)
                .unwrap();
            payload = text;
        }
        out.push((b0, String::from_utf8(payload).unwrap()));
    }
    out
}

#[tokio::test]
async fn with_deflate_long_messages_go_compressed_and_short_ones_plain() {
    for stateless in [false, true] {
        for room in [usize::MAX, 3] {
            let mut w = deflating(room, stateless);
            let long = format!(r#"["NOTICE","{}"]"#, "abc".repeat(300));
            w.send("short").await.unwrap();
            w.send(&long).await.unwrap();
            w.send(&long).await.unwrap();
            let body = format!(r#"{{"content":"{}"}}"#, "xyz".repeat(100));
            let shared = std::sync::OnceLock::new();
            for sub in ["a", "b"] {
                let prefix = format!(r#"["EVENT","{sub}","#);
                if !w.try_send_event(&prefix, &body, "]", &shared).unwrap() {
                    w.flush().await.unwrap();
                }
            }
            let f = inflated(&w.io.data);
            let plain: Vec<&str> = f.iter().map(|(_, t)| t.as_str()).collect();
            assert_eq!(
                plain,
                [
                    "short",
                    long.as_str(),
                    long.as_str(),
                    &format!(r#"["EVENT","a",{body}]"#),
                    &format!(r#"["EVENT","b",{body}]"#),
                ],
                "stateless {stateless} room {room}"
            );
            let rsv1: Vec<bool> = f.iter().map(|(b0, _)| b0 & frame::RSV1 != 0).collect();
            assert_eq!(rsv1, [false, true, true, true, true]);
            assert!(w.io.data.len() < 2 * long.len());
            assert_eq!(w.held_capacity(), 0);
        }
    }
}

#[tokio::test]
async fn an_event_in_parts_is_one_frame_even_on_a_slow_socket() {
    let mut w = writer(5, HOLD, 4 << 20);
    assert!(
        !w.try_send_event(r#"["EVENT","s","#, r#"{"k":1}"#, "]", &Default::default())
            .unwrap()
    );
    w.flush().await.unwrap();
    let f = frames(&w.io.data);
    assert_eq!(f, [(frame::TEXT, br#"["EVENT","s",{"k":1}]"#.to_vec())]);
}

#[tokio::test]
async fn an_event_held_in_parts_is_the_frame_of_the_joined_text() {
    let mut w = writer(usize::MAX, HOLD, 4 << 20);
    let prefix = "[\"EVENT\",\"s\",";
    let body = "{\"id\":\"x\",\"content\":\"é\"}";
    w.state.hold_event(prefix, body, "]");
    w.state.hold_text(&format!("{prefix}{body}]"));
    assert_eq!(w.io.writes, 0, "holding writes nothing");
    w.flush().await.unwrap();
    assert_eq!(w.io.writes, 1);
    let f = frames(&w.io.data);
    assert_eq!(f.len(), 2);
    assert_eq!(f[0], f[1]);
    assert_eq!(f[0].1, format!("{prefix}{body}]").into_bytes());
    assert!(!w.state.must_flush_to_feed_len(HOLD));
}

#[tokio::test]
async fn a_written_buffer_stays_with_the_thread_for_the_next_chunk_a_small_one_does_not() {
    SPARE_HELD.with_borrow_mut(|s| s.clear());
    let prefix = "[\"EVENT\",\"s\",";
    let event = "x".repeat(1000);
    let mut a = writer(usize::MAX, HOLD, 4 << 20);
    for _ in 0..60 {
        a.state.hold_event(prefix, &event, "]");
    }
    let grown = a.held_capacity();
    assert!(grown > HOLD_START, "{grown}");
    a.flush().await.unwrap();
    assert_eq!(a.held_capacity(), 0, "a written connection holds nothing");
    // The next connection this thread holds frames for starts in it.
    let mut b = writer(usize::MAX, HOLD, 4 << 20);
    b.state.hold_event(prefix, &event, "]");
    assert_eq!(b.held_capacity(), grown);
    b.flush().await.unwrap();
    assert_eq!(frames(&b.io.data).len(), 1);
    // A lone small message's buffer is freed, not kept.
    SPARE_HELD.with_borrow_mut(|s| s.clear());
    let mut c = writer(usize::MAX, HOLD, 4 << 20);
    c.state.hold_text("[\"EOSE\",\"s\"]");
    c.flush().await.unwrap();
    assert!(SPARE_HELD.with_borrow(|s| s.is_empty()));
}
