use flate2::{Compress, Compression, FlushCompress};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::codec::*;
use super::*;

/// A server frame (unmasked), as a relay writes it.
fn server_frame(fin: bool, rsv1: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(u8::from(fin) << 7) | (u8::from(rsv1) << 6) | opcode];
    match payload.len() {
        n @ 0..=125 => out.push(n as u8),
        n @ 126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// What a server does per RFC 7692 7.2.1: raw deflate, sync flush, tail off.
fn server_deflate(c: &mut Compress, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 64);
    c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
    assert!(out.ends_with(&DEFLATE_TAIL), "sync flush leaves the tail");
    out.truncate(out.len() - 4);
    out
}

#[test]
fn frames_parse_at_every_length_form() {
    for len in [0usize, 5, 125, 126, 300, 0xffff, 0x10000, 70_000] {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let bytes = server_frame(true, false, OP_TEXT, &payload);
        let (f, used) = parse_frame(&bytes, 1 << 20).unwrap().unwrap();
        assert_eq!(
            (f.fin, f.rsv1, f.opcode, used),
            (true, false, OP_TEXT, bytes.len())
        );
        assert_eq!(f.payload, payload);
        assert_eq!(server_frame_len(len), bytes.len());
        // Every strict prefix is incomplete, never an error.
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            if cut < bytes.len() {
                assert_eq!(
                    parse_frame(&bytes[..cut], 1 << 20).unwrap(),
                    None,
                    "len {len} cut {cut}"
                );
            }
        }
    }
    // Two frames back to back: the first is taken, the rest left.
    let mut two = server_frame(false, true, OP_TEXT, b"ab");
    two.extend(server_frame(true, false, OP_CONTINUATION, b"cd"));
    let (f, used) = parse_frame(&two, 100).unwrap().unwrap();
    assert_eq!((f.fin, f.rsv1, used), (false, true, 4));
    assert_eq!(
        parse_frame(&two[used..], 100).unwrap().unwrap().0.payload,
        b"cd"
    );
}

#[test]
fn bad_frames_are_refused() {
    let masked = [0x81, 0x81, 1, 2, 3, 4, b'x' ^ 1];
    assert!(parse_frame(&masked, 100).is_err());
    assert!(parse_frame(&[0xA1, 0x00], 100).is_err(), "RSV2");
    assert!(parse_frame(&[0x83, 0x00], 100).is_err(), "opcode 3");
    assert!(parse_frame(&server_frame(false, false, OP_PING, b""), 100).is_err());
    assert!(parse_frame(&server_frame(true, true, OP_PING, b""), 100).is_err());
    assert!(parse_frame(&server_frame(true, false, OP_CLOSE, &[0; 126]), 1000).is_err());
    assert!(parse_frame(&server_frame(true, false, OP_TEXT, &[0; 101]), 100).is_err());
}

#[test]
fn client_frames_are_masked() {
    for len in [3usize, 200, 70_000] {
        let payload = vec![b'z'; len];
        let bytes = encode_frame(OP_TEXT, true, &payload, [9, 8, 7, 6]);
        assert_eq!(bytes[0], 0xC1);
        assert_eq!(bytes[1] & 0x80, 0x80);
        let (len_field, header) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        assert_eq!(len_field, len);
        let mask = &bytes[header..header + 4];
        let unmasked: Vec<u8> = bytes[header + 4..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(unmasked, payload);
    }
}

#[test]
fn extension_answers_parse() {
    let p = parse_extensions("permessage-deflate", true)
        .unwrap()
        .unwrap();
    assert_eq!(p, DeflateParams::default());
    let p = parse_extensions(
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
         server_max_window_bits=10; client_max_window_bits=\"12\"",
        true,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        p,
        DeflateParams {
            server_no_context_takeover: true,
            client_no_context_takeover: true,
            server_max_window_bits: Some(10),
            client_max_window_bits: Some(12),
        }
    );
    assert_eq!(parse_extensions("", true).unwrap(), None);
    for bad in [
        "x-webkit-deflate-frame",
        "permessage-deflate, permessage-deflate",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=7",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; server_no_context_takeover=1",
        "permessage-deflate; mystery",
    ] {
        assert!(parse_extensions(bad, true).is_err(), "{bad}");
    }
    // A client window the client did not offer.
    assert!(parse_extensions("permessage-deflate; client_max_window_bits=15", false).is_err());
}

#[test]
fn handshake_answers_parse() {
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let accept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
    let head = |ext: &str| {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\nConnection: upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n{ext}"
        )
    };
    let h = parse_handshake(&head(""), key, true).unwrap();
    assert_eq!((h.extensions, h.deflate), (None, None));
    let h = parse_handshake(
        &head("Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover\r\n"),
        key,
        true,
    )
    .unwrap();
    assert_eq!(
        h.extensions.as_deref(),
        Some("permessage-deflate; client_no_context_takeover")
    );
    assert!(h.deflate.unwrap().client_no_context_takeover);
    let ext = "Sec-WebSocket-Extensions: permessage-deflate\r\n";
    assert!(
        parse_handshake(&head(ext), key, false).is_err(),
        "not offered"
    );
    assert!(parse_handshake(&head(""), "AAAAAAAAAAAAAAAAAAAAAA==", true).is_err());
    assert!(parse_handshake("HTTP/1.1 429 Too Many Requests\r\n", key, true).is_err());
    let relay = RelayUrl::parse("ws://127.0.0.1:7777/nostr?x=1").unwrap();
    let req = handshake_request(&relay, key, true);
    assert!(req.starts_with("GET /nostr?x=1 HTTP/1.1\r\nHost: 127.0.0.1:7777\r\n"));
    assert!(req.ends_with(&format!(
        "Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n\r\n"
    )));
    let relay = RelayUrl::parse("ws://127.0.0.1:7777").unwrap();
    assert!(handshake_request(&relay, key, false).starts_with("GET / HTTP/1.1\r\n"));
}

/// Messages alike enough that a kept window shrinks the later ones.
fn messages() -> Vec<String> {
    (0..20)
        .map(|i| {
            format!(
                r#"["EVENT","s",{{"id":"{:064x}","kind":1,"content":"note number {i} about relays and compression","tags":[["t","nostr"]]}}]"#,
                i * 7919
            )
        })
        .collect()
}

fn push_all(r: &mut Reader, frames: Vec<Vec<u8>>) -> Vec<(Msg, MsgSize)> {
    let mut got = Vec::new();
    for bytes in frames {
        let (f, used) = parse_frame(&bytes, 1 << 20).unwrap().unwrap();
        got.extend(r.push(f, used).unwrap());
    }
    got
}

#[test]
fn compressed_messages_round_trip_with_and_without_context_takeover() {
    for (bits, reset_each) in [(15u8, false), (15, true), (9, false)] {
        let params = DeflateParams {
            server_no_context_takeover: reset_each,
            server_max_window_bits: (bits != 15).then_some(bits),
            ..DeflateParams::default()
        };
        let mut c = Compress::new_with_window_bits(Compression::default(), false, bits);
        let mut reader = Reader::new(Some(&params), 1 << 20, true);
        let (mut wire, mut plain) = (0, 0);
        for text in messages() {
            let data = server_deflate(&mut c, text.as_bytes());
            if reset_each {
                c.reset();
            }
            // Split over three frames, a ping between the first two.
            let third = data.len() / 3;
            let frames = vec![
                server_frame(false, true, OP_TEXT, &data[..third]),
                server_frame(true, false, OP_PING, b"hi"),
                server_frame(false, false, OP_CONTINUATION, &data[third..2 * third]),
                server_frame(true, false, OP_CONTINUATION, &data[2 * third..]),
            ];
            let got = push_all(&mut reader, frames);
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].0, Msg::Ping(b"hi".to_vec()));
            assert_eq!(got[1].0, Msg::Text(text.clone()));
            assert!(got[1].1.compressed);
            assert_eq!(got[1].1.payload, text.len());
            wire += got[1].1.wire;
            plain += text.len();
        }
        assert!(
            wire < plain,
            "bits {bits} reset {reset_each}: {wire} >= {plain}"
        );
    }
}

#[test]
fn uncompressed_messages_pass_beside_compressed_ones() {
    let params = DeflateParams::default();
    let mut c = Compress::new_with_window_bits(Compression::default(), false, 15);
    let mut reader = Reader::new(Some(&params), 1 << 20, true);
    let frames = vec![
        server_frame(true, false, OP_TEXT, br#"["EOSE","s"]"#),
        server_frame(true, true, OP_TEXT, &server_deflate(&mut c, b"compressed")),
        server_frame(true, false, OP_BINARY, &[1, 2, 3]),
    ];
    let got: Vec<Msg> = push_all(&mut reader, frames)
        .into_iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(
        got,
        [
            Msg::Text(r#"["EOSE","s"]"#.into()),
            Msg::Text("compressed".into()),
            Msg::Binary(vec![1, 2, 3])
        ]
    );
    // RSV1 without the extension, and a stray continuation, are errors.
    let mut plain = Reader::new(None, 1 << 20, true);
    let f = parse_frame(&server_frame(true, true, OP_TEXT, b"x"), 100)
        .unwrap()
        .unwrap();
    assert!(plain.push(f.0, f.1).is_err());
    let f = parse_frame(&server_frame(true, false, OP_CONTINUATION, b"x"), 100)
        .unwrap()
        .unwrap();
    assert!(plain.push(f.0, f.1).is_err());
}

#[test]
fn discarding_reader_keeps_the_window() {
    let params = DeflateParams::default();
    let mut c = Compress::new_with_window_bits(Compression::default(), false, 15);
    let mut reader = Reader::new(Some(&params), 1 << 20, false);
    for text in messages() {
        let frame = server_frame(
            true,
            true,
            OP_TEXT,
            &server_deflate(&mut c, text.as_bytes()),
        );
        let got = push_all(&mut reader, vec![frame]);
        assert_eq!(got[0].0, Msg::Discarded);
        assert_eq!(
            got[0].1.payload,
            text.len(),
            "inflated to follow the window"
        );
    }
}

#[test]
fn client_deflater_output_inflates() {
    for no_context in [false, true] {
        let params = DeflateParams {
            client_no_context_takeover: no_context,
            server_no_context_takeover: no_context,
            ..DeflateParams::default()
        };
        let mut d = Deflater::new(&params).unwrap();
        let mut inf = Inflater::new(&params);
        for text in messages() {
            let data = d.deflate(text.as_bytes());
            assert!(!data.ends_with(&DEFLATE_TAIL));
            let mut out = Vec::new();
            inf.inflate(&data, &mut out, 1 << 20).unwrap();
            assert_eq!(out, text.as_bytes());
        }
    }
    let eight = DeflateParams {
        client_max_window_bits: Some(8),
        ..DeflateParams::default()
    };
    assert!(Deflater::new(&eight).is_none());
    let mut inf = Inflater::new(&DeflateParams::default());
    let big = Deflater::new(&DeflateParams::default())
        .unwrap()
        .deflate(&[b'a'; 100_000]);
    assert!(
        inf.inflate(&big, &mut Vec::new(), 50_000).is_err(),
        "bomb cap"
    );
}

/// A relay in a few lines: agrees to permessage-deflate, pings, sends one
/// compressed message in two frames and one plain one, echoes the close.
#[tokio::test]
async fn a_connection_negotiates_counts_and_answers_pings() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        while !req.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            req.push(b[0]);
        }
        let req = String::from_utf8(req).unwrap();
        assert!(req.contains(&format!("Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n")));
        let key = req
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .unwrap();
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\nSec-WebSocket-Extensions: permessage-deflate; \
             server_max_window_bits=12\r\n\r\n",
            derive_accept_key(key.as_bytes())
        );
        let mut c = Compress::new_with_window_bits(Compression::default(), false, 12);
        let data = server_deflate(&mut c, "hello hello hello hello".as_bytes());
        let mut out = answer.into_bytes();
        out.extend(server_frame(true, false, OP_PING, b"p"));
        s.write_all(&out).await.unwrap();
        // The pong (2 + 4 mask + 1) comes while the client has nothing else to read.
        let mut pong = [0u8; 7];
        s.read_exact(&mut pong).await.unwrap();
        assert_eq!((pong[0], pong[1] & 0x7f), (0x80 | OP_PONG, 1));
        let mut out = Vec::new();
        out.extend(server_frame(false, true, OP_TEXT, &data[..2]));
        out.extend(server_frame(true, false, OP_CONTINUATION, &data[2..]));
        out.extend(server_frame(true, false, OP_TEXT, b"plain"));
        out.extend(server_frame(true, false, OP_CLOSE, &1000u16.to_be_bytes()));
        s.write_all(&out).await.unwrap();
        // The close echo (2 + 4 mask + 2).
        let mut back = [0u8; 8];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!((back[0], back[1] & 0x7f), (0x80 | OP_CLOSE, 2));
    });
    let relay = RelayUrl::parse(&url).unwrap();
    let mut ws = WsRaw::connect(&relay, &Options::default()).await.unwrap();
    let params = ws.handshake().deflate.unwrap();
    assert_eq!(params.server_max_window_bits, Some(12));
    let first = tokio::time::timeout(Duration::from_secs(10), ws.recv());
    let (m, size) = first.await.expect("the pong went out").unwrap().unwrap();
    assert_eq!(m, Msg::Text("hello hello hello hello".into()));
    assert!(size.compressed && size.wire < server_frame_len(23));
    let (m, _) = ws.recv().await.unwrap().unwrap();
    assert_eq!(m, Msg::Text("plain".into()));
    let (m, _) = ws.recv().await.unwrap().unwrap();
    assert_eq!(m, Msg::Close(Some(1000)));
    server.await.unwrap();
    let c = ws.counters();
    assert_eq!((c.messages_received, c.compressed_received), (2, 1));
    assert_eq!(c.payload_received, 23 + 5);
    assert_eq!(c.sent, 15);
    assert!(c.handshake_sent > 100 && c.handshake_received > 100);
}
