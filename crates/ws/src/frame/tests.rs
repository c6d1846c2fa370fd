use super::*;

/// A client frame as a client library writes it.
pub(crate) fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut f = vec![(u8::from(fin) << 7) | opcode];
    let len = payload.len();
    if len < 126 {
        f.push(0x80 | len as u8);
    } else if len <= 0xFFFF {
        f.push(0x80 | 126);
        f.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        f.push(0x80 | 127);
        f.extend_from_slice(&(len as u64).to_be_bytes());
    }
    f.extend_from_slice(&mask);
    let mut p = payload.to_vec();
    for (i, b) in p.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    f.extend_from_slice(&p);
    f
}

#[test]
fn headers_of_each_length_form_parse_and_need_more_until_whole() {
    for len in [0usize, 5, 125, 126, 300, 65_535, 65_536, 200_000] {
        let payload = vec![7u8; len];
        let f = client_frame(true, TEXT, &payload, [1, 2, 3, 4]);
        let h = parse_header(&f, usize::MAX, false).unwrap().unwrap();
        assert_eq!(h.payload_len, len);
        assert_eq!(h.frame_len(), f.len());
        assert!(h.fin && h.opcode == TEXT && h.mask == [1, 2, 3, 4]);
        for cut in 0..h.header_len {
            assert_eq!(
                parse_header(&f[..cut], usize::MAX, false),
                Ok(None),
                "{len} {cut}"
            );
        }
    }
}

#[test]
fn a_payload_over_the_bound_is_refused_from_the_header() {
    let f = client_frame(true, TEXT, &[0u8; 1000], [0; 4]);
    assert_eq!(parse_header(&f, 999, false), Err(FrameFault::TooLarge));
    assert!(parse_header(&f, 1000, false).unwrap().is_some());
    // Only the header is needed to refuse it.
    assert_eq!(parse_header(&f[..8], 999, false), Err(FrameFault::TooLarge));
    let mut huge = vec![0x81, 0xFF];
    huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
    huge.extend_from_slice(&[0; 4]);
    assert_eq!(
        parse_header(&huge, 1 << 40, false),
        Err(FrameFault::TooLarge)
    );
    huge[2] = 0x80;
    assert!(matches!(
        parse_header(&huge, usize::MAX, false),
        Err(FrameFault::Protocol(_))
    ));
}

#[test]
fn frames_against_the_rfc_are_refused() {
    let bad = |f: &[u8]| {
        matches!(
            parse_header(f, usize::MAX, false),
            Err(FrameFault::Protocol(_))
        )
    };
    // Unmasked.
    assert!(bad(&[0x81, 0x05, b'h', b'e', b'l', b'l', b'o']));
    // Reserved bits.
    assert!(bad(&client_frame(true, TEXT, b"x", [0; 4])
        .iter()
        .enumerate()
        .map(|(i, b)| if i == 0 { b | 0x40 } else { *b })
        .collect::<Vec<_>>()));
    // Unknown opcodes, data and control.
    assert!(bad(&client_frame(true, 0x3, b"", [0; 4])));
    assert!(bad(&client_frame(true, 0xB, b"", [0; 4])));
    // A fragmented or long control frame.
    assert!(bad(&client_frame(false, PING, b"", [0; 4])));
    assert!(bad(&client_frame(true, PING, &[0; 126], [0; 4])));
    assert!(!bad(&client_frame(true, PING, &[0; 125], [0; 4])));
}

#[test]
fn rsv1_marks_a_data_messages_first_frame_only_once_deflate_is_agreed() {
    let with = |f: Vec<u8>, bits: u8| {
        let mut f = f;
        f[0] |= bits;
        f
    };
    let deflate = |f: &[u8]| parse_header(f, usize::MAX, true);
    let text = with(client_frame(true, TEXT, b"x", [0; 4]), RSV1);
    assert!(deflate(&text).unwrap().unwrap().compressed);
    assert!(matches!(
        parse_header(&text, usize::MAX, false),
        Err(FrameFault::Protocol(_))
    ));
    let binary = with(client_frame(false, BINARY, b"x", [0; 4]), RSV1);
    assert!(deflate(&binary).unwrap().unwrap().compressed);
    assert!(
        !deflate(&client_frame(true, TEXT, b"x", [0; 4]))
            .unwrap()
            .unwrap()
            .compressed
    );
    for refused in [
        with(client_frame(true, CONTINUATION, b"x", [0; 4]), RSV1),
        with(client_frame(true, PING, b"x", [0; 4]), RSV1),
        with(client_frame(true, CLOSE, b"", [0; 4]), RSV1),
        with(client_frame(true, TEXT, b"x", [0; 4]), 0x20),
        with(client_frame(true, TEXT, b"x", [0; 4]), 0x10),
    ] {
        assert!(
            matches!(deflate(&refused), Err(FrameFault::Protocol(_))),
            "{refused:?}"
        );
    }
}

#[test]
fn unmask_is_its_own_inverse_at_every_length_and_alignment() {
    let mask = [0xA1, 0x02, 0xF3, 0x44];
    for len in 0..40 {
        let plain: Vec<u8> = (0..len as u8).collect();
        let mut p = plain.clone();
        unmask(&mut p, mask);
        let expect: Vec<u8> = plain
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(p, expect);
        unmask(&mut p, mask);
        assert_eq!(p, plain);
    }
}

#[test]
fn server_headers_use_the_shortest_length_form() {
    assert_eq!(
        server_header(TEXT, 5),
        ([0x81, 5, 0, 0, 0, 0, 0, 0, 0, 0], 2)
    );
    let (h, n) = server_header(TEXT, 126);
    assert_eq!((&h[..n], n), (&[0x81, 126, 0, 126][..], 4));
    let (h, n) = server_header(CLOSE, 70_000);
    assert_eq!(n, 10);
    assert_eq!(h[0], 0x88);
    assert_eq!(h[1], 127);
    assert_eq!(u64::from_be_bytes(h[2..10].try_into().unwrap()), 70_000);
}
