//! Differential test: random client frame sequences, valid and not, read by
//! [`WsRead`] and by tungstenite's reader (`tungstenite::protocol::WebSocket`
//! in the server role, the same bound on frames and messages, unmasked
//! frames refused), give the same messages up to the first error, and then
//! both fail at the same point or both reach the end.
//!
//! tungstenite 0.29 has no permessage-deflate, so the reader runs without
//! it. What is compared: data messages (a text's content, a binary's
//! length), Pings' payloads, the Close (its code and reason), and whether
//! the stream ended with an error. Error kinds are not compared: each
//! reader checks in its own order.
//!
//! The differences that are deliberate, and normalised by [`normalise`]
//! (each with the RFC's word that allows both behaviours):
//!
//! 1. tungstenite surfaces Pongs; our reader drops them. RFC 6455 section
//!    5.5.3: a Pong "MAY be sent unsolicited" and "a response to an
//!    unsolicited Pong frame is not expected"; the relay sends no Pings, so
//!    every Pong is unsolicited. Pongs are left out of tungstenite's
//!    messages.
//! 2. The end of a stream: tungstenite says `ResetWithoutClosingHandshake`
//!    at the end of the bytes (before a Close) and `ConnectionClosed` on the
//!    read after a Close; our reader ends with `None` in both cases. Both
//!    count as the end, not as an error: the bytes read held no invalid
//!    frame (RFC 6455 section 7.1.5 gives a connection closed without a
//!    Close frame the code 1006, an abnormal closure, not a protocol error),
//!    and after a Close neither reads more (section 5.5.1: after its Close
//!    an endpoint "MUST NOT send any more data frames").
//! 3. A Close with a code that no endpoint may send (RFC 6455 section 7.4:
//!    0-999, 1004-1006, 1015, the unassigned 1016-2999, 5000 and over): our
//!    reader fails the connection (what Autobahn's cases 7.9.* expect: a
//!    close with 1002, "protocol error", section 7.4.1); tungstenite returns
//!    a Close of its own, `1002 "Protocol violation"`, in its place, which
//!    it also answers. Both end the connection there; RFC 6455 does not say
//!    which a receiver must do. Compared as an error.
//! 4. A Close with 1014: IANA's close code registry (RFC 6455 section 11.7)
//!    has it, "Bad Gateway", as it has 1012 and 1013 ("Service Restart",
//!    "Try Again Later"); our reader accepts the three, tungstenite 1012 and
//!    1013 but not 1014, which it treats as in 3 (a Close 1002 in its
//!    place). Compared as our reader's Close.
//! 5. A fragmented text whose bytes already cannot be UTF-8 before it is
//!    whole: tungstenite fails at that fragment (fail fast), our reader
//!    when the message is whole (or at another error first, or at the end
//!    of the stream). RFC 6455 section 5.6 requires the whole message to be
//!    valid UTF-8 ("a particular text frame might include a partial UTF-8
//!    sequence; however, the whole message MUST contain valid UTF-8") and
//!    section 8.1 to fail the connection when it is not; failing early is
//!    allowed, not required (Autobahn's 6.4.* call it non-strict). Our
//!    reader may then give control messages (Pings, a Close) that came in
//!    between, never the text.
//! 6. A stream cut inside a frame whose header alone is against RFC 6455
//!    (reserved bits, reserved opcode, a fragmented control frame or one
//!    over 125 bytes, an unmasked frame, a length with its top bit set,
//!    over the bound): our reader fails from the header, tungstenite reads
//!    the whole frame before its checks but for the opcode and the bound,
//!    and reaches the end of the bytes first. RFC 6455 sections 5.2 and 5.5
//!    ("MUST _Fail the WebSocket Connection_") do not say when the check is
//!    made; failing as soon as the header is read is the stricter.
//!
//! No normalisation covers a mismatch of our reader against RFC 6455: such
//! a case fails the test.

use std::io::{self, Cursor, Read, Write};

use futures_util::FutureExt;
use proptest::prelude::*;
use tungstenite::error::ProtocolError;
use tungstenite::protocol::{Role, WebSocket, WebSocketConfig};

use super::{Message, WsError, WsRead};

/// Frame opcodes (RFC 6455 section 5.2).
const CONT: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// How a frame's payload length is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LenForm {
    /// The shortest form (RFC 6455 section 5.2 asks the sender for it).
    Minimal,
    /// Always `126` and 16 bits (when the length fits).
    Sixteen,
    /// Always `127` and 64 bits.
    SixtyFour,
    /// `127` and 64 bits with the top bit set (RFC 6455 section 5.2: "the
    /// most significant bit MUST be 0"): a length no reader takes.
    TopBit,
}

#[derive(Debug, Clone)]
struct Frame {
    fin: bool,
    /// RSV1-3, as the 3 bits under FIN.
    rsv: u8,
    opcode: u8,
    mask: Option<[u8; 4]>,
    len_form: LenForm,
    payload: Vec<u8>,
}

impl Frame {
    /// A frame as a client writes it: final, no reserved bits, masked, the
    /// shortest length; [`perturbed`] changes these.
    fn new(fin: bool, opcode: u8, payload: Vec<u8>) -> Frame {
        Frame {
            fin,
            rsv: 0,
            opcode,
            mask: Some([0x5a, 0x01, 0xc3, 0x7e]),
            len_form: LenForm::Minimal,
            payload,
        }
    }

    fn is_control(&self) -> bool {
        self.opcode & 0x8 != 0
    }

    /// The frame's bytes, and the length of its header.
    fn to_bytes(&self) -> (Vec<u8>, usize) {
        let mut out = vec![(u8::from(self.fin) << 7) | (self.rsv << 4) | self.opcode];
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        let len = self.payload.len();
        let form = match self.len_form {
            LenForm::Minimal if len < 126 => LenForm::Minimal,
            LenForm::Minimal | LenForm::Sixteen if len <= 0xFFFF => LenForm::Sixteen,
            LenForm::Minimal | LenForm::Sixteen => LenForm::SixtyFour,
            other => other,
        };
        match form {
            LenForm::Minimal => out.push(mask_bit | len as u8),
            LenForm::Sixteen => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            LenForm::SixtyFour => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
            LenForm::TopBit => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(len as u64 | 1 << 63).to_be_bytes());
            }
        }
        if let Some(mask) = self.mask {
            out.extend_from_slice(&mask);
        }
        let header_len = out.len();
        let mut payload = self.payload.clone();
        if let Some(mask) = self.mask {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        out.extend_from_slice(&payload);
        (out, header_len)
    }

    /// Whether the header alone is against RFC 6455 (sections 5.2, 5.3,
    /// 5.5) for a server without extensions reading with `max` as the
    /// frame bound.
    fn header_is_invalid(&self, max: usize) -> bool {
        let reserved_opcode = !matches!(self.opcode, CONT | TEXT | BINARY | CLOSE | PING | PONG);
        self.rsv != 0
            || reserved_opcode
            || self.mask.is_none()
            || self.len_form == LenForm::TopBit
            || (self.is_control() && (!self.fin || self.payload.len() > 125))
            || self.payload.len() > max
    }
}

/// A message as both readers are compared on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Msg {
    Text(String),
    Binary(usize),
    Ping(Vec<u8>),
    Close(Option<(u16, String)>),
}

/// How reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// The end of the bytes, or the end after a Close.
    Done,
    /// An error: what it was, for the report.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    msgs: Vec<Msg>,
    end: End,
}

/// Our reader over the bytes, the first `already` of them given as read
/// past the upgrade request, the others read `read_size` bytes at a time;
/// and what its protocol error was, if it failed with one.
fn ours(bytes: &[u8], already: usize, max: usize, read_size: usize) -> (Outcome, Option<String>) {
    let (already, rest) = bytes.split_at(already);
    let mut reader = WsRead::new(rest, already, max, read_size, false);
    let mut msgs = Vec::new();
    loop {
        let step = reader
            .next()
            .now_or_never()
            .expect("the reader waited on a byte slice");
        let m = match step {
            None => {
                return (
                    Outcome {
                        msgs,
                        end: End::Done,
                    },
                    None,
                );
            }
            Some(Err(e)) => {
                let what = match &e {
                    WsError::Protocol(what) => Some((*what).to_owned()),
                    _ => None,
                };
                let end = End::Failed(format!("ours: {e}"));
                return (Outcome { msgs, end }, what);
            }
            Some(Ok(m)) => m,
        };
        msgs.push(match m {
            Message::Text(t) => Msg::Text(t),
            Message::Binary(n) => Msg::Binary(n),
            Message::Ping(p) => Msg::Ping(p),
            Message::Close(c) => Msg::Close(c.map(|c| (c.code, c.reason))),
        });
    }
}

/// The client's bytes to read, and a sink for what tungstenite answers
/// (Pongs, its Close): a `Cursor` would write them over the bytes to come.
struct Wire(Cursor<Vec<u8>>);

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// tungstenite's reader over the bytes, as a server with `max` as the
/// frame and message bound, unmasked frames refused; and whether it failed
/// on invalid UTF-8.
fn theirs(bytes: &[u8], max: usize) -> (Outcome, bool) {
    use tungstenite::{Error, Message as T};
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
        .accept_unmasked_frames(false);
    let mut ws = WebSocket::from_raw_socket(
        Wire(Cursor::new(bytes.to_vec())),
        Role::Server,
        Some(config),
    );
    let mut msgs = Vec::new();
    loop {
        let m = match ws.read() {
            Ok(m) => m,
            // Difference 2: the end of the bytes, or the read after a Close.
            Err(Error::ConnectionClosed)
            | Err(Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => {
                return (
                    Outcome {
                        msgs,
                        end: End::Done,
                    },
                    false,
                );
            }
            Err(e) => {
                let utf8 = matches!(e, Error::Utf8(_));
                let end = End::Failed(format!("tungstenite: {e}"));
                return (Outcome { msgs, end }, utf8);
            }
        };
        msgs.push(match m {
            T::Text(t) => Msg::Text(t.as_str().to_owned()),
            T::Binary(b) => Msg::Binary(b.len()),
            T::Ping(p) => Msg::Ping(p.to_vec()),
            // Difference 1: Pongs are not surfaced by our reader.
            T::Pong(_) => continue,
            T::Close(c) => Msg::Close(c.map(|c| (u16::from(c.code), c.reason.as_str().to_owned()))),
            T::Frame(_) => unreachable!("tungstenite reads no raw frames"),
        });
    }
}

/// A case: frames, the bound, where the stream is cut (if it is: at this
/// fraction of its length, in 65,536ths), how much of it our reader is
/// given as already read (the same way) and how many bytes it takes at
/// once.
#[derive(Debug, Clone)]
struct Case {
    frames: Vec<Frame>,
    max: usize,
    cut: Option<u16>,
    already: u16,
    read_size: usize,
}

/// `fraction` (in 65,536ths) of `len`.
fn part_of(len: usize, fraction: u16) -> usize {
    ((u64::from(fraction) * (len as u64 + 1)) >> 16) as usize
}

impl Case {
    /// The stream's bytes, and the frame the cut falls inside of (not on
    /// its first byte), if any.
    fn bytes(&self) -> (Vec<u8>, Option<usize>) {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for f in &self.frames {
            starts.push(bytes.len());
            bytes.extend(f.to_bytes().0);
        }
        let Some(cut) = self.cut else {
            return (bytes, None);
        };
        let at = part_of(bytes.len(), cut);
        bytes.truncate(at);
        let inside = starts
            .iter()
            .zip(&self.frames)
            .position(|(&s, f)| s < at && at < s + f.to_bytes().0.len());
        (bytes, inside)
    }
}

/// tungstenite's outcome, with the deliberate differences (module docs)
/// that remain after reading taken out where they apply to this case.
fn normalise(
    case: &Case,
    cut_inside: Option<usize>,
    ours: &Outcome,
    our_protocol_error: Option<&str>,
    theirs: &Outcome,
    their_utf8_error: bool,
) -> Outcome {
    let mut t = theirs.clone();
    // Differences 3 and 4: a Close tungstenite put in place of one with a
    // code it refuses.
    let replaced = matches!(
        t.msgs.last(),
        Some(Msg::Close(Some((1002, reason)))) if reason == "Protocol violation"
    );
    if replaced && t.end == End::Done {
        // 3: a code no endpoint may send, which our reader refuses.
        if our_protocol_error == Some("an invalid close code")
            && ours.msgs.len() + 1 == t.msgs.len()
        {
            t.msgs.pop();
            t.end = ours.end.clone();
        }
        // 4: 1014, which our reader accepts.
        if let Some(m @ Msg::Close(Some((1014, _)))) = ours.msgs.last()
            && ours.msgs.len() == t.msgs.len()
        {
            *t.msgs.last_mut().expect("a Close") = m.clone();
        }
    }
    // Difference 5: tungstenite failed fast on a fragmented text that
    // cannot be UTF-8; our reader gives what came in between (control
    // messages only) and stops later, at the latest at the Close.
    let fragmented_text = case.frames.iter().any(|f| f.opcode == TEXT && !f.fin);
    if their_utf8_error
        && fragmented_text
        && ours.msgs.len() >= t.msgs.len()
        && ours.msgs[..t.msgs.len()] == t.msgs[..]
    {
        let extra = &ours.msgs[t.msgs.len()..];
        let only_control = extra
            .iter()
            .all(|m| matches!(m, Msg::Ping(_) | Msg::Close(_)));
        if only_control {
            t.msgs = ours.msgs.clone();
            t.end = ours.end.clone();
        }
    }
    // Difference 6: cut inside a frame whose header is invalid: our reader
    // fails from the header, tungstenite ends first.
    if let Some(i) = cut_inside
        && matches!(ours.end, End::Failed(_))
        && t.end == End::Done
        && ours.msgs == t.msgs
        && case.frames[i].header_is_invalid(case.max)
    {
        t.end = ours.end.clone();
    }
    t
}

/// Whether two outcomes agree: the same messages, and both failed or
/// neither.
fn agree(a: &Outcome, b: &Outcome) -> bool {
    a.msgs == b.msgs && matches!(a.end, End::Failed(_)) == matches!(b.end, End::Failed(_))
}

// Strategies.

/// Text: mostly characters of 1 to 4 bytes in UTF-8 (so that fragments
/// split them), sometimes raw bytes or a valid text with a byte broken.
fn text_bytes() -> impl Strategy<Value = Vec<u8>> {
    let ch = prop_oneof![
        4 => prop::char::range('a', 'z'),
        1 => Just('é'),
        1 => Just('€'),
        1 => Just('𝄞'),
        1 => any::<char>(),
    ];
    let valid = prop::collection::vec(ch, 0..40)
        .prop_map(|cs| cs.into_iter().collect::<String>().into_bytes());
    prop_oneof![
        6 => valid.clone(),
        1 => prop::collection::vec(any::<u8>(), 0..20),
        1 => (valid, any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut b, i, v)| {
            if !b.is_empty() {
                let at = i.index(b.len());
                b[at] = v;
            } else {
                b.push(v);
            }
            b
        }),
        // A long text (over small bounds).
        1 => (1usize..300).prop_map(|n| "é".repeat(n / 2).into_bytes()),
    ]
}

fn binary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..40),
        1 => (100usize..300).prop_map(|n| vec![0xAB; n]),
    ]
}

/// A control frame: Pings and Pongs, sometimes over 125 bytes; Closes with
/// no body, one byte, a code valid or not, a reason that is UTF-8 or not.
fn control_frame() -> impl Strategy<Value = Frame> {
    let payload = prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..20),
        1 => prop::collection::vec(any::<u8>(), 120..130),
    ];
    let code = prop_oneof![
        6 => prop::sample::select(vec![
            0u16, 999, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010,
            1011, 1012, 1013, 1014, 1015, 1016, 2000, 2999, 3000, 3999, 4000, 4999, 5000,
            65535,
        ]),
        1 => any::<u16>(),
    ];
    let reason = prop_oneof![
        4 => prop::collection::vec(prop::char::range(' ', '~'), 0..12)
            .prop_map(|cs| cs.into_iter().collect::<String>().into_bytes()),
        1 => Just("fermé €".as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..8),
        1 => (119usize..126).prop_map(|n| vec![b'r'; n]),
    ];
    let close_body = prop_oneof![
        1 => Just(Vec::new()),
        1 => any::<u8>().prop_map(|b| vec![b]),
        6 => (code, reason).prop_map(|(c, r)| {
            let mut b = c.to_be_bytes().to_vec();
            b.extend(r);
            b
        }),
    ];
    prop_oneof![
        4 => payload.clone().prop_map(|p| Frame::new(true, PING, p)),
        3 => payload.prop_map(|p| Frame::new(true, PONG, p)),
        2 => close_body.prop_map(|p| Frame::new(true, CLOSE, p)),
    ]
}

/// A data message in 1 to 4 fragments cut anywhere (inside a character
/// too), with control frames between them.
fn message_frames() -> impl Strategy<Value = Vec<Frame>> {
    let content = prop_oneof![
        3 => text_bytes().prop_map(|b| (true, b)),
        1 => binary_bytes().prop_map(|b| (false, b)),
    ];
    (
        content,
        prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        prop::collection::vec(prop::option::weighted(0.3, control_frame()), 4),
    )
        .prop_map(|((text, bytes), cuts, between)| {
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut bounds = vec![0];
            bounds.extend(at);
            bounds.push(bytes.len());
            let n = bounds.len() - 1;
            let mut frames = Vec::new();
            for i in 0..n {
                let opcode = match (i, text) {
                    (0, true) => TEXT,
                    (0, false) => BINARY,
                    _ => CONT,
                };
                let part = bytes[bounds[i]..bounds[i + 1]].to_vec();
                frames.push(Frame::new(i + 1 == n, opcode, part));
                if i + 1 < n
                    && let Some(c) = &between[i]
                {
                    frames.push(c.clone());
                }
            }
            frames
        })
}

/// Any frame at all: any opcode (the reserved ones too), FIN or not.
fn raw_frame() -> impl Strategy<Value = Frame> {
    (
        any::<bool>(),
        0u8..16,
        prop::collection::vec(any::<u8>(), 0..20),
    )
        .prop_map(|(fin, opcode, payload)| Frame::new(fin, opcode, payload))
}

/// A frame's header changed now and then: reserved bits, no mask, another
/// length form.
fn perturbed(f: Frame) -> impl Strategy<Value = Frame> {
    (
        prop_oneof![60 => Just(0u8), 1 => 1u8..8],
        prop::option::weighted(0.985, any::<[u8; 4]>()),
        prop_oneof![
            80 => Just(LenForm::Minimal),
            8 => Just(LenForm::Sixteen),
            8 => Just(LenForm::SixtyFour),
            1 => Just(LenForm::TopBit),
        ],
    )
        .prop_map(move |(rsv, mask, len_form)| Frame {
            rsv,
            mask,
            len_form,
            ..f.clone()
        })
}

fn case() -> impl Strategy<Value = Case> {
    let item = prop_oneof![
        12 => message_frames(),
        5 => control_frame().prop_map(|f| vec![f]),
        1 => raw_frame().prop_map(|f| vec![f]),
    ];
    let frames = prop::collection::vec(item, 0..8)
        .prop_map(|items| items.into_iter().flatten().collect::<Vec<_>>())
        .prop_flat_map(|frames| frames.into_iter().map(perturbed).collect::<Vec<_>>());
    (
        frames,
        prop_oneof![
            1 => prop::sample::select(vec![0usize, 1, 16]),
            2 => Just(125usize),
            2 => Just(200usize),
            5 => Just(4096usize),
        ],
        prop::option::weighted(0.2, any::<u16>()),
        prop_oneof![3 => Just(0u16), 1 => any::<u16>()],
        prop::sample::select(vec![14usize, 15, 64, 4096]),
    )
        .prop_map(|(frames, max, cut, already, read_size)| Case {
            frames,
            max,
            cut,
            already,
            read_size,
        })
}

/// Both readers over one case, compared.
fn check(case: &Case) -> Result<(), TestCaseError> {
    let (bytes, cut_inside) = case.bytes();
    let already = part_of(bytes.len(), case.already).min(bytes.len());
    let (our, our_protocol_error) = ours(&bytes, already, case.max, case.read_size);
    let (their, their_utf8_error) = theirs(&bytes, case.max);
    let normalised = normalise(
        case,
        cut_inside,
        &our,
        our_protocol_error.as_deref(),
        &their,
        their_utf8_error,
    );
    prop_assert!(
        agree(&our, &normalised),
        "the readers disagree\n ours: {our:?}\n tungstenite: {their:?}\n normalised: {normalised:?}\n bytes: {}",
        hex::encode(&bytes)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn our_reader_reads_frames_as_tungstenite_does(case in case()) {
        check(&case)?;
    }
}

/// Cases written out: each deliberate difference once, and a few streams
/// both readers must read alike.
#[test]
fn known_cases() {
    let case = |frames: Vec<Frame>, max: usize| Case {
        frames,
        max,
        cut: None,
        already: 0,
        read_size: 4096,
    };
    let close = |code: u16, reason: &str| {
        let mut b = code.to_be_bytes().to_vec();
        b.extend_from_slice(reason.as_bytes());
        Frame::new(true, CLOSE, b)
    };
    let runs = |c: &Case| {
        let (bytes, _) = c.bytes();
        (ours(&bytes, 0, c.max, c.read_size), theirs(&bytes, c.max))
    };

    // Fragments with a character split between them, a Ping and a Pong
    // between them (the Pong is tungstenite's only), and a Close.
    let c = case(
        vec![
            Frame::new(false, TEXT, "caf\u{e9} \u{20ac}".as_bytes()[..7].to_vec()),
            Frame::new(true, PING, b"p".to_vec()),
            Frame::new(true, PONG, b"q".to_vec()),
            Frame::new(true, CONT, "caf\u{e9} \u{20ac}".as_bytes()[7..].to_vec()),
            close(1000, "bye"),
            Frame::new(true, TEXT, b"after the close".to_vec()),
        ],
        4096,
    );
    let ((our, _), (their, _)) = runs(&c);
    assert_eq!(our, their);
    assert_eq!(
        our.msgs,
        vec![
            Msg::Ping(b"p".to_vec()),
            Msg::Text("caf\u{e9} \u{20ac}".into()),
            Msg::Close(Some((1000, "bye".into())))
        ]
    );
    check(&c).unwrap();

    // Difference 3: an invalid close code.
    let c = case(vec![close(1005, "")], 4096);
    let ((our, _), (their, _)) = runs(&c);
    assert!(matches!(our.end, End::Failed(_)) && our.msgs.is_empty());
    let protocol = Msg::Close(Some((1002, "Protocol violation".into())));
    assert_eq!(their.msgs, vec![protocol.clone()]);
    check(&c).unwrap();
    // Difference 4: 1014; 1012 and 1013 read alike.
    let c = case(vec![close(1014, "x")], 4096);
    let ((our, _), (their, _)) = runs(&c);
    assert_eq!(our.msgs, vec![Msg::Close(Some((1014, "x".into())))]);
    assert_eq!(their.msgs, vec![protocol]);
    check(&c).unwrap();
    for code in [1012, 1013] {
        let ((our, _), (their, _)) = runs(&case(vec![close(code, "x")], 4096));
        assert_eq!(our, their);
    }

    // Difference 5: fail fast on a fragment that cannot be UTF-8.
    let c = case(
        vec![
            Frame::new(false, TEXT, vec![b'a', 0xFF]),
            Frame::new(true, PING, vec![]),
            Frame::new(true, CONT, b"b".to_vec()),
        ],
        4096,
    );
    let ((our, _), (their, _)) = runs(&c);
    assert_eq!(our.msgs, vec![Msg::Ping(vec![])]);
    assert!(matches!(our.end, End::Failed(_)));
    assert!(their.msgs.is_empty() && matches!(their.end, End::Failed(_)));
    check(&c).unwrap();

    // Difference 6: a control frame over 125 bytes, cut short.
    let mut c = case(vec![Frame::new(true, PING, vec![0; 200])], 4096);
    c.cut = Some(6554);
    let (bytes, inside) = c.bytes();
    assert_eq!(inside, Some(0), "{}", bytes.len());
    let ((our, _), (their, _)) = runs(&c);
    assert!(matches!(our.end, End::Failed(_)));
    assert_eq!(their.end, End::Done);
    check(&c).unwrap();

    // Both refuse: non-minimal lengths are taken, the top bit is not, an
    // unmasked frame is not.
    let mut f = Frame::new(true, TEXT, b"x".to_vec());
    f.len_form = LenForm::SixtyFour;
    let ((our, _), (their, _)) = runs(&case(vec![f.clone()], 4096));
    assert_eq!((&our, &their.msgs), (&their, &vec![Msg::Text("x".into())]));
    f.len_form = LenForm::TopBit;
    let ((our, _), (their, _)) = runs(&case(vec![f.clone()], 4096));
    assert!(agree(&our, &their) && matches!(our.end, End::Failed(_)));
    f.len_form = LenForm::Minimal;
    f.mask = None;
    let ((our, _), (their, _)) = runs(&case(vec![f], 4096));
    assert!(agree(&our, &their) && matches!(our.end, End::Failed(_)));
}
