use super::super::frame::tests::client_frame;
use super::*;
use tokio::io::AsyncWriteExt;

const MASK: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

fn text(s: &str) -> Vec<u8> {
    client_frame(true, frame::TEXT, s.as_bytes(), MASK)
}

/// A reader over an in-memory pipe, and the client's end.
fn pair(
    max: usize,
    read_size: usize,
) -> (WsRead<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
    let (a, b) = tokio::io::duplex(1 << 20);
    (WsRead::new(a, &[], max, read_size, false), b)
}

#[tokio::test]
async fn messages_split_anywhere_and_packed_together_come_out_whole_and_in_order() {
    let words: Vec<String> = (0..50)
        .map(|i| format!("[\"REQ\",\"{i}\",{{}}]").repeat(i % 7 + 1))
        .collect();
    let mut wire = Vec::new();
    for w in &words {
        wire.extend_from_slice(&text(w));
    }
    for cut in [1usize, 2, 3, 7, 13, 64, 1000, wire.len()] {
        let (mut r, mut c) = pair(1 << 16, 16);
        let w2 = wire.clone();
        let writer = tokio::spawn(async move {
            for chunk in w2.chunks(cut) {
                c.write_all(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            c
        });
        for w in &words {
            assert_eq!(
                r.next().await.unwrap().unwrap(),
                Message::Text(w.clone()),
                "cut {cut}"
            );
        }
        drop(writer.await.unwrap());
        assert!(r.next().await.is_none());
        assert_eq!(r.held(), 0, "nothing held once read");
    }
}

#[tokio::test]
async fn an_idle_connection_holds_no_buffer_between_messages() {
    let (mut r, mut c) = pair(1 << 16, 4096);
    let big = "x".repeat(20_000);
    let f = text(&big);
    c.write_all(&f[..5000]).await.unwrap();
    let task = tokio::spawn(async move {
        let m = r.next().await;
        (r, m)
    });
    tokio::task::yield_now().await;
    c.write_all(&f[5000..]).await.unwrap();
    let (mut r, m) = task.await.unwrap();
    assert_eq!(m.unwrap().unwrap(), Message::Text(big));
    assert_eq!(r.held(), 0);
    c.write_all(&text("[]")).await.unwrap();
    assert_eq!(r.next().await.unwrap().unwrap(), Message::Text("[]".into()));
    assert_eq!(r.held(), 0);
}

#[tokio::test]
async fn fragments_with_a_ping_between_them_assemble_into_one_message() {
    let (mut r, mut c) = pair(1 << 16, 4096);
    let mut wire = client_frame(false, frame::TEXT, b"[\"CLO", MASK);
    wire.extend(client_frame(true, frame::PING, b"hi", MASK));
    wire.extend(client_frame(false, frame::CONTINUATION, b"SE\",", MASK));
    wire.extend(client_frame(true, frame::PONG, b"", MASK));
    wire.extend(client_frame(true, frame::CONTINUATION, b"\"x\"]", MASK));
    wire.extend(client_frame(
        true,
        frame::CLOSE,
        &[0x03, 0xE8, b'o', b'k'],
        MASK,
    ));
    c.write_all(&wire).await.unwrap();
    assert_eq!(
        r.next().await.unwrap().unwrap(),
        Message::Ping(b"hi".to_vec())
    );
    assert_eq!(
        r.next().await.unwrap().unwrap(),
        Message::Text("[\"CLOSE\",\"x\"]".into())
    );
    assert_eq!(
        r.next().await.unwrap().unwrap(),
        Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "ok".into()
        }))
    );
    // Nothing is read after a Close.
    c.write_all(&text("late")).await.unwrap();
    assert!(r.next().await.is_none());
}

#[tokio::test]
async fn bad_input_is_an_error_and_ends_the_stream() {
    type Expect = fn(&WsError) -> bool;
    let cases: Vec<(Vec<u8>, Expect)> = vec![
        (client_frame(true, frame::TEXT, &[0xFF, 0xFE], MASK), |e| {
            matches!(e, WsError::BadUtf8)
        }),
        (client_frame(true, frame::TEXT, &[b'a'; 101], MASK), |e| {
            matches!(e, WsError::TooLarge)
        }),
        (client_frame(true, frame::CONTINUATION, b"x", MASK), |e| {
            matches!(e, WsError::Protocol(_))
        }),
        (
            [client_frame(false, frame::TEXT, b"x", MASK), text("y")].concat(),
            |e| matches!(e, WsError::Protocol(_)),
        ),
        (
            [
                client_frame(false, frame::TEXT, &[b'a'; 60], MASK),
                client_frame(true, frame::CONTINUATION, &[b'a'; 60], MASK),
            ]
            .concat(),
            |e| matches!(e, WsError::TooLarge),
        ),
        (client_frame(true, frame::CLOSE, &[0x03, 0xED], MASK), |e| {
            matches!(e, WsError::Protocol(_))
        }),
        (client_frame(true, frame::CLOSE, &[0x03], MASK), |e| {
            matches!(e, WsError::Protocol(_))
        }),
        (vec![0x81, 0x02, b'h', b'i'], |e| {
            matches!(e, WsError::Protocol(_))
        }),
    ];
    for (wire, expect) in cases {
        let (mut r, mut c) = pair(100, 4096);
        c.write_all(&wire).await.unwrap();
        let e = r.next().await.unwrap().unwrap_err();
        assert!(expect(&e), "{e:?}");
        assert!(r.next().await.is_none());
        assert_eq!(r.held(), 0);
    }
}

#[tokio::test]
async fn bytes_read_with_the_upgrade_come_first() {
    let (a, mut c) = tokio::io::duplex(1 << 16);
    let first = text("one");
    let mut r = WsRead::new(a, &first[..4], 1 << 16, 4096, false);
    c.write_all(&first[4..]).await.unwrap();
    c.write_all(&text("two")).await.unwrap();
    assert_eq!(
        r.next().await.unwrap().unwrap(),
        Message::Text("one".into())
    );
    assert_eq!(
        r.next().await.unwrap().unwrap(),
        Message::Text("two".into())
    );
}

/// A client's compressed message (no context takeover), in `pieces` frames.
fn compressed(text: &str, pieces: usize) -> Vec<u8> {
    let mut c = flate2::Compress::new(flate2::Compression::default(), false);
    let mut z = Vec::with_capacity(text.len() + 64);
    c.compress_vec(text.as_bytes(), &mut z, flate2::FlushCompress::Sync)
        .unwrap();
    z.truncate(z.len() - 4);
    let size = z.len().div_ceil(pieces);
    let chunks: Vec<&[u8]> = z.chunks(size).collect();
    let mut wire = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let op = if i == 0 {
            frame::TEXT
        } else {
            frame::CONTINUATION
        };
        let mut f = client_frame(i + 1 == chunks.len(), op, chunk, MASK);
        if i == 0 {
            f[0] |= frame::RSV1;
        }
        wire.extend_from_slice(&f);
    }
    wire
}

#[tokio::test]
async fn compressed_messages_inflate_whole_or_fragmented_beside_plain_ones() {
    let (a, mut c) = tokio::io::duplex(1 << 20);
    let mut r = WsRead::new(a, &[], 1 << 16, 4096, true);
    let req = format!(r#"["REQ","s",{{"authors":["{}"]}}]"#, "ab".repeat(32));
    let mut wire = compressed(&req, 1);
    wire.extend_from_slice(&text("plain"));
    wire.extend_from_slice(&compressed(&req, 3));
    c.write_all(&wire).await.unwrap();
    for want in [req.as_str(), "plain", req.as_str()] {
        assert_eq!(r.next().await.unwrap().unwrap(), Message::Text(want.into()));
    }
    drop(c);
    assert!(r.next().await.is_none());
    assert_eq!(r.held(), 0);
}

#[tokio::test]
async fn a_message_inflating_past_the_bound_is_too_large() {
    let (a, mut c) = tokio::io::duplex(1 << 20);
    let mut r = WsRead::new(a, &[], 4096, 4096, true);
    c.write_all(&compressed(&"x".repeat(100_000), 1))
        .await
        .unwrap();
    assert!(matches!(r.next().await, Some(Err(WsError::TooLarge))));
    // Without the extension agreed, RSV1 is a protocol error.
    let (a, mut c) = tokio::io::duplex(1 << 20);
    let mut r = WsRead::new(a, &[], 4096, 4096, false);
    c.write_all(&compressed("hello", 1)).await.unwrap();
    assert!(matches!(r.next().await, Some(Err(WsError::Protocol(_)))));
}
