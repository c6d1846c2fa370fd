//! The parts of RFC 6455 and RFC 7692 that need no socket: frames in and
//! out, the permessage-deflate parameters of a handshake answer, and the
//! inflating and deflating of messages. Each is a plain function or state
//! machine so the tests can drive it byte by byte.

use anyhow::{Context, bail, ensure};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// The tail a sync flush leaves, which RFC 7692 removes from each message
/// (7.2.1) and the receiver appends again before inflating (7.2.2).
pub const DEFLATE_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The window when the server names none (RFC 7692 7.1.2.1).
pub const DEFAULT_WINDOW_BITS: u8 = 15;

/// One frame as the server sent it, payload unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    /// Set on the first frame of a compressed message (RFC 7692 6).
    pub rsv1: bool,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

fn is_control(opcode: u8) -> bool {
    opcode & 0x8 != 0
}

/// Parses one server frame from the start of `buf`: `Ok(None)` while it is
/// incomplete, else the frame and the bytes it took. A masked frame, RSV2
/// or RSV3, an unknown opcode, a fragmented or compressed or long control
/// frame, or a payload over `max_payload` is an error.
pub fn parse_frame(buf: &[u8], max_payload: usize) -> anyhow::Result<Option<(Frame, usize)>> {
    let [b0, b1, ..] = *buf else { return Ok(None) };
    let (fin, rsv1, opcode) = (b0 & 0x80 != 0, b0 & 0x40 != 0, b0 & 0x0f);
    ensure!(b0 & 0x30 == 0, "frame with RSV2 or RSV3 set");
    ensure!(
        matches!(
            opcode,
            OP_CONTINUATION | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG
        ),
        "unknown opcode {opcode:#x}"
    );
    ensure!(b1 & 0x80 == 0, "the server sent a masked frame");
    let (len, header) = match b1 & 0x7f {
        126 => {
            let Some(b) = buf.get(2..4) else {
                return Ok(None);
            };
            (u64::from(u16::from_be_bytes([b[0], b[1]])), 4)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let len = u64::from_be_bytes(b.try_into().expect("8 bytes"));
            ensure!(len >> 63 == 0, "frame length with the top bit set");
            (len, 10)
        }
        n => (u64::from(n), 2),
    };
    if is_control(opcode) {
        ensure!(fin, "fragmented control frame");
        ensure!(!rsv1, "compressed control frame");
        ensure!(len <= 125, "control frame of {len} bytes");
    }
    ensure!(
        len <= max_payload as u64,
        "frame of {len} bytes, more than {max_payload}"
    );
    let end = header + len as usize;
    let Some(payload) = buf.get(header..end) else {
        return Ok(None);
    };
    let frame = Frame {
        fin,
        rsv1,
        opcode,
        payload: payload.to_vec(),
    };
    Ok(Some((frame, end)))
}

/// One client frame (FIN set, masked with `mask` as RFC 6455 5.3 requires).
pub fn encode_frame(opcode: u8, rsv1: bool, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(0x80 | if rsv1 { 0x40 } else { 0 } | opcode);
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n @ 126..=0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// The bytes a frame of `payload_len` bytes takes from the server (unmasked,
/// FIN, one frame): what an uncompressed message would have cost.
pub fn server_frame_len(payload_len: usize) -> usize {
    payload_len
        + match payload_len {
            0..=125 => 2,
            126..=0xffff => 4,
            _ => 10,
        }
}

/// The permessage-deflate parameters a server agreed to (RFC 7692 7.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeflateParams {
    pub server_no_context_takeover: bool,
    pub client_no_context_takeover: bool,
    pub server_max_window_bits: Option<u8>,
    pub client_max_window_bits: Option<u8>,
}

/// Parses the `Sec-WebSocket-Extensions` of a 101 answer (several header
/// lines joined with commas): `None` when it is empty, the agreed
/// parameters when it is permessage-deflate. Another extension, a second
/// one, an unknown, repeated or malformed parameter, or a
/// `client_max_window_bits` the client did not offer (`offered_client_bits`)
/// fails the handshake, as RFC 7692 7.1 says the client must.
pub fn parse_extensions(
    value: &str,
    offered_client_bits: bool,
) -> anyhow::Result<Option<DeflateParams>> {
    let offers: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let [ext] = offers.as_slice() else {
        ensure!(offers.is_empty(), "more than one extension agreed: {value}");
        return Ok(None);
    };
    let mut parts = ext.split(';').map(str::trim);
    let name = parts.next().unwrap_or_default();
    ensure!(
        name.eq_ignore_ascii_case("permessage-deflate"),
        "extension not offered: {name}"
    );
    let mut p = DeflateParams::default();
    let mut seen = Vec::new();
    for param in parts {
        let (key, val) = match param.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        let key = key.to_ascii_lowercase();
        ensure!(!seen.contains(&key), "parameter {key} given twice");
        match (key.as_str(), val) {
            ("server_no_context_takeover", None) => p.server_no_context_takeover = true,
            ("client_no_context_takeover", None) => p.client_no_context_takeover = true,
            ("server_max_window_bits", Some(v)) => p.server_max_window_bits = Some(window_bits(v)?),
            ("client_max_window_bits", Some(v)) => {
                ensure!(
                    offered_client_bits,
                    "client_max_window_bits was not offered"
                );
                p.client_max_window_bits = Some(window_bits(v)?);
            }
            _ => bail!("bad permessage-deflate parameter: {param}"),
        }
        seen.push(key);
    }
    Ok(Some(p))
}

fn window_bits(v: &str) -> anyhow::Result<u8> {
    let bits: u8 = v.parse().with_context(|| format!("window bits {v:?}"))?;
    ensure!(
        (8..=15).contains(&bits),
        "window bits {bits} outside 8..=15"
    );
    Ok(bits)
}

/// Inflates compressed messages from the server. The zlib state is made on
/// the first compressed message (an idle connection never holds one), kept
/// from message to message (the server's sliding window), or reset after
/// each when `server_no_context_takeover` was agreed.
pub struct Inflater {
    state: Option<Decompress>,
    window_bits: u8,
    reset_each: bool,
}

impl Inflater {
    pub fn new(params: &DeflateParams) -> Inflater {
        Inflater {
            state: None,
            // flate2 takes 9..=15; a larger window decodes a smaller one's output.
            window_bits: params
                .server_max_window_bits
                .unwrap_or(DEFAULT_WINDOW_BITS)
                .max(9),
            reset_each: params.server_no_context_takeover,
        }
    }

    /// Appends the inflated message to `out`; more than `max` bytes is an error.
    pub fn inflate(&mut self, data: &[u8], out: &mut Vec<u8>, max: usize) -> anyhow::Result<()> {
        let bits = self.window_bits;
        let d = self
            .state
            .get_or_insert_with(|| Decompress::new_with_window_bits(false, bits));
        let start = out.len();
        for chunk in [data, &DEFLATE_TAIL[..]] {
            let mut input = chunk;
            loop {
                if out.capacity() - out.len() < 4096 {
                    out.reserve((input.len() * 4).max(8192));
                }
                let (in_before, out_before) = (d.total_in(), out.len());
                let status = d
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .context("inflating a message")?;
                input = &input[(d.total_in() - in_before) as usize..];
                ensure!(
                    out.len() - start <= max,
                    "message inflates past {max} bytes"
                );
                ensure!(
                    status != Status::StreamEnd,
                    "compressed message ends its deflate stream"
                );
                // Done with this input once it is all in and output space
                // was left over (nothing is held back for lack of room).
                let spare = out.capacity() > out.len();
                if input.is_empty() && spare {
                    break;
                }
                let stalled = d.total_in() == in_before && out.len() == out_before;
                ensure!(!(stalled && spare), "inflating a message: corrupt data");
            }
        }
        if self.reset_each {
            d.reset(false);
        }
        Ok(())
    }
}

/// Compresses client messages: raw deflate, sync flush, the tail removed.
pub struct Deflater {
    state: Compress,
    reset_each: bool,
}

impl Deflater {
    /// `None` when the agreed client window is 8 bits, which zlib cannot
    /// write (it would use 9): the client then sends uncompressed, as
    /// RFC 7692 allows per message.
    pub fn new(params: &DeflateParams) -> Option<Deflater> {
        let bits = params.client_max_window_bits.unwrap_or(DEFAULT_WINDOW_BITS);
        (bits >= 9).then(|| Deflater {
            state: Compress::new_with_window_bits(Compression::default(), false, bits),
            reset_each: params.client_no_context_takeover,
        })
    }

    pub fn deflate(&mut self, data: &[u8]) -> Vec<u8> {
        let c = &mut self.state;
        let mut out = Vec::with_capacity(data.len() / 2 + 64);
        let mut input = data;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let before = c.total_in();
            c.compress_vec(input, &mut out, FlushCompress::Sync)
                .expect("deflate never fails on valid state");
            input = &input[(c.total_in() - before) as usize..];
            // A sync flush is complete once output space was left over.
            if input.is_empty() && out.capacity() > out.len() {
                break;
            }
        }
        if out.ends_with(&DEFLATE_TAIL) {
            out.truncate(out.len() - DEFLATE_TAIL.len());
        }
        if self.reset_each {
            c.reset();
        }
        out
    }
}

/// A message or control frame, as the reader hands it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Text(String),
    Binary(Vec<u8>),
    /// A data message not kept (the reader was told to discard data).
    Discarded,
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
}

/// What one message cost and carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgSize {
    /// Bytes of its frames on the wire, headers included.
    pub wire: usize,
    /// Bytes of its payload after inflating.
    pub payload: usize,
    pub compressed: bool,
}

struct Partial {
    opcode: u8,
    compressed: bool,
    /// The payload so far (empty for discarded uncompressed messages).
    data: Vec<u8>,
    /// Payload bytes so far, kept or not.
    len: usize,
    wire: usize,
}

/// Puts frames together into messages, inflating compressed ones.
pub struct Reader {
    inflater: Option<Inflater>,
    partial: Option<Partial>,
    max_message: usize,
    keep_data: bool,
}

impl Reader {
    /// `deflate`: the agreed parameters, if any. `keep_data: false` drops
    /// data messages unread (and never inflates), for connections that
    /// only need to stay open.
    pub fn new(deflate: Option<&DeflateParams>, max_message: usize, keep_data: bool) -> Reader {
        Reader {
            inflater: deflate.map(Inflater::new),
            partial: None,
            max_message,
            keep_data,
        }
    }

    /// Takes one frame and its size on the wire; a message once complete.
    pub fn push(&mut self, f: Frame, wire: usize) -> anyhow::Result<Option<(Msg, MsgSize)>> {
        if is_control(f.opcode) {
            let size = MsgSize {
                wire,
                payload: f.payload.len(),
                compressed: false,
            };
            let msg = match f.opcode {
                OP_PING => Msg::Ping(f.payload),
                OP_PONG => Msg::Pong(f.payload),
                _ => Msg::Close(
                    (f.payload.len() >= 2)
                        .then(|| u16::from_be_bytes([f.payload[0], f.payload[1]])),
                ),
            };
            return Ok(Some((msg, size)));
        }
        let mut p = match (self.partial.take(), f.opcode) {
            (None, OP_CONTINUATION) => bail!("continuation frame without a message"),
            (Some(_), OP_TEXT | OP_BINARY) => bail!("new message inside a fragmented one"),
            (Some(_), _) if f.rsv1 => bail!("RSV1 on a continuation frame"),
            (Some(p), _) => p,
            (None, opcode) => {
                ensure!(
                    !f.rsv1 || self.inflater.is_some(),
                    "compressed frame without permessage-deflate"
                );
                Partial {
                    opcode,
                    compressed: f.rsv1,
                    data: Vec::new(),
                    len: 0,
                    wire: 0,
                }
            }
        };
        p.len += f.payload.len();
        ensure!(
            p.len <= self.max_message,
            "message over {} bytes",
            self.max_message
        );
        p.wire += wire;
        if self.keep_data || p.compressed {
            p.data.extend_from_slice(&f.payload);
        }
        if !f.fin {
            self.partial = Some(p);
            return Ok(None);
        }
        self.finish(p).map(Some)
    }

    fn finish(&mut self, p: Partial) -> anyhow::Result<(Msg, MsgSize)> {
        let mut size = MsgSize {
            wire: p.wire,
            payload: p.len,
            compressed: p.compressed,
        };
        if !self.keep_data {
            // Inflated anyway when the server keeps its context: the next
            // message needs this one's window.
            if let (true, Some(inf)) = (p.compressed, &mut self.inflater)
                && !inf.reset_each
            {
                let mut out = Vec::new();
                inf.inflate(&p.data, &mut out, self.max_message)?;
                size.payload = out.len();
            }
            return Ok((Msg::Discarded, size));
        }
        let data = match (p.compressed, &mut self.inflater) {
            (true, Some(inf)) => {
                let mut out = Vec::with_capacity(p.data.len() * 3);
                inf.inflate(&p.data, &mut out, self.max_message)?;
                out
            }
            _ => p.data,
        };
        size.payload = data.len();
        let msg = if p.opcode == OP_TEXT {
            Msg::Text(String::from_utf8(data).context("text message is not UTF-8")?)
        } else {
            Msg::Binary(data)
        };
        Ok((msg, size))
    }
}
