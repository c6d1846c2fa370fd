use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use super::*;

fn settings(window_bytes: u32) -> DeflateSettings {
    DeflateSettings {
        level: 6,
        min_bytes: 0,
        window_bytes,
    }
}

fn agreed(server_no_context: bool, bits: u8) -> Agreed {
    Agreed {
        server_no_context,
        server_window_bits: bits,
    }
}

/// A client's inflater: one stream across messages (context takeover)
/// unless reset, as RFC 7692 section 7.2.2 says.
fn client_inflate(d: &mut Decompress, payload: &[u8]) -> Vec<u8> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&TRAILER);
    let mut out = Vec::with_capacity(1 << 20);
    let start = d.total_in();
    while ((d.total_in() - start) as usize) < input.len() {
        let at = (d.total_in() - start) as usize;
        d.decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
            .unwrap();
    }
    out
}

fn notes() -> Vec<String> {
    (0..40)
        .map(|i| {
            format!(
                r#"["EVENT","sub",{{"id":"{:064x}","pubkey":"{}","created_at":{},"kind":1,"tags":[["t","nostr"]],"content":"note number {i} says hello to everyone","sig":"{:0128x}"}}]"#,
                i * 7919,
                "ab".repeat(32),
                1_700_000_000 + i,
                i * 104_729
            )
        })
        .collect()
}

#[test]
fn sliding_messages_refer_to_earlier_ones_and_inflate_in_order() {
    let budget = WindowBudget::new(1 << 20);
    let mut d = Deflater::new(agreed(false, 15), settings(4096), budget.clone());
    let mut client = Decompress::new(false);
    let mut alone = Deflater::new(agreed(true, 15), settings(4096), budget.clone());
    let (mut total, mut total_alone) = (0, 0);
    for m in notes() {
        let mut out = Vec::new();
        d.compress(&[m.as_bytes()], &mut out);
        assert_eq!(client_inflate(&mut client, &out), m.as_bytes());
        total += out.len();
        let mut out = Vec::new();
        alone.compress(&[m.as_bytes()], &mut out);
        total_alone += out.len();
        assert!(d.held() <= 4096);
    }
    // The window pays: later messages repeat most of the earlier ones.
    assert!(total * 10 < total_alone * 8, "{total} vs {total_alone}");
    assert_eq!(alone.held(), 0);
    assert_eq!(budget.held(), 4096);
    drop(d);
    assert_eq!(budget.held(), 0);
}

#[test]
fn a_smaller_window_is_kept_to() {
    for bits in [9u8, 10, 12] {
        let mut d = Deflater::new(
            agreed(false, bits),
            settings(32_768),
            WindowBudget::new(1 << 20),
        );
        let mut client = Decompress::new_with_window_bits(false, bits);
        for m in notes() {
            let mut out = Vec::new();
            d.compress(&[m.as_bytes(), b"tail"], &mut out);
            let mut want = m.clone().into_bytes();
            want.extend_from_slice(b"tail");
            assert_eq!(client_inflate(&mut client, &out), want);
            assert!(d.held() <= 1 << bits);
        }
    }
}

#[test]
fn windows_past_the_budget_are_not_made_and_messages_still_inflate() {
    let budget = WindowBudget::new(4096);
    let mut first = Deflater::new(agreed(false, 15), settings(4096), budget.clone());
    let mut second = Deflater::new(agreed(false, 15), settings(4096), budget.clone());
    let mut client = Decompress::new(false);
    for m in notes().iter().take(5) {
        let mut out = Vec::new();
        first.compress(&[m.as_bytes()], &mut out);
        let mut out = Vec::new();
        second.compress(&[m.as_bytes()], &mut out);
        assert_eq!(client_inflate(&mut client, &out), m.as_bytes());
    }
    assert_eq!((first.held(), second.held()), (4096, 0));
    drop(first);
    assert_eq!(budget.held(), 0);
}

#[test]
fn a_spliced_message_inflates_to_its_parts_and_its_body_is_compressed_once() {
    let mut a = Deflater::new(agreed(true, 15), settings(4096), WindowBudget::new(1 << 20));
    let mut b = Deflater::new(agreed(true, 15), settings(4096), WindowBudget::new(1 << 20));
    let body = &notes()[3][13..];
    let body = &body[..body.len() - 1];
    let key = OnceLock::new();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    a.spliced(br#"["EVENT","a","#, body.as_bytes(), &key, b"]", &mut x);
    assert!(key.get().is_some(), "the body is kept compressed with it");
    b.spliced(br#"["EVENT","bb","#, body.as_bytes(), &key, b"]", &mut y);
    for (payload, sub) in [(&x, "a"), (&y, "bb")] {
        // Each message on its own: a fresh inflater.
        let text = client_inflate(&mut Decompress::new(false), payload);
        assert_eq!(text, format!(r#"["EVENT","{sub}",{body}]"#).as_bytes());
    }
    // The compressed body is the same bytes in both.
    let shared = x.len() - (r#"["EVENT","a","#.len() + 5) - 7;
    assert_eq!(
        x[x.len() - 7 - shared..x.len() - 7],
        y[y.len() - 7 - shared..y.len() - 7]
    );
    assert!(x.len() < body.len());
}

#[test]
fn inflating_is_bounded_and_refuses_bad_data() {
    let text = notes().join("");
    let mut c = Compress::new(Compression::default(), false);
    let mut z = Vec::with_capacity(1 << 20);
    c.compress_vec(text.as_bytes(), &mut z, FlushCompress::Sync)
        .unwrap();
    strip_trailer(&mut z);
    assert_eq!(inflate(&z, text.len()).unwrap(), text.as_bytes());
    assert!(matches!(
        inflate(&z, text.len() - 1),
        Err(WsError::TooLarge)
    ));
    // A deflate bomb: 100 MB of zeros in about 100 KB, refused at the bound.
    let zeros = vec![0u8; 100 << 20];
    let mut c = Compress::new(Compression::best(), false);
    let mut bomb = Vec::with_capacity(1 << 20);
    c.compress_vec(&zeros, &mut bomb, FlushCompress::Sync)
        .unwrap();
    assert!(bomb.len() < 200_000, "{}", bomb.len());
    assert!(matches!(inflate(&bomb, 256 << 10), Err(WsError::TooLarge)));
    // Not DEFLATE at all.
    assert!(matches!(
        inflate(&[0xff, 0xff, 0xff, 0xff, 0x00], 1 << 16),
        Err(WsError::Protocol(_))
    ));
    // An empty message (the trailer only) is the empty text.
    assert_eq!(inflate(&[0x00], 16).unwrap(), b"");
}

#[test]
fn a_smaller_window_compresses_the_shared_body_for_itself() {
    let mut small = Deflater::new(agreed(true, 10), settings(4096), WindowBudget::new(1 << 20));
    let shared = OnceLock::new();
    let body = notes()[5].repeat(3);
    let mut x = Vec::new();
    small.spliced(b"[", body.as_bytes(), &shared, b"]", &mut x);
    assert!(shared.get().is_none(), "kept only for the default window");
    let text = client_inflate(&mut Decompress::new_with_window_bits(false, 10), &x);
    assert_eq!(text, format!("[{body}]").as_bytes());
}
