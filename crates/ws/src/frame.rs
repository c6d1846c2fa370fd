//! RFC 6455 frames, pure: the header of a client's frame read from bytes
//! ([`parse_header`]), its payload unmasked in place ([`unmask`]), and the
//! header of a frame the relay sends ([`server_header`]; server frames are
//! not masked).

/// Opcodes (RFC 6455 section 5.2).
pub(crate) const CONTINUATION: u8 = 0x0;
pub(crate) const TEXT: u8 = 0x1;
pub(crate) const BINARY: u8 = 0x2;
pub(crate) const CLOSE: u8 = 0x8;
pub(crate) const PING: u8 = 0x9;
pub(crate) const PONG: u8 = 0xA;
/// The first reserved bit: a compressed message (RFC 7692 section 6).
pub(crate) const RSV1: u8 = 0x40;

/// The longest header: 2 bytes, an 8-byte length, a 4-byte mask.
pub(crate) const MAX_HEADER: usize = 14;

/// A client frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub fin: bool,
    /// RSV1: the first frame of a compressed message.
    pub compressed: bool,
    pub opcode: u8,
    pub mask: [u8; 4],
    /// Bytes of the header itself.
    pub header_len: usize,
    pub payload_len: usize,
}

impl Header {
    /// The frame's whole length on the wire.
    pub(crate) fn frame_len(&self) -> usize {
        self.header_len + self.payload_len
    }
}

/// Why a frame is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameFault {
    /// A payload longer than the bound.
    TooLarge,
    /// Against RFC 6455: what is wrong, for the log.
    Protocol(&'static str),
}

/// Reads a client frame's header from the start of `buf`: `Ok(None)` when
/// more bytes are needed to know it. A frame whose payload exceeds
/// `max_payload` is refused from its header, before its payload is read.
/// `deflate`: permessage-deflate was agreed (RSV1 may mark a data
/// message's first frame).
pub(crate) fn parse_header(
    buf: &[u8],
    max_payload: usize,
    deflate: bool,
) -> Result<Option<Header>, FrameFault> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x30 != 0 {
        return Err(FrameFault::Protocol(
            "RSV2 or RSV3 set (no extension uses them)",
        ));
    }
    let compressed = b0 & RSV1 != 0;
    if compressed && !deflate {
        return Err(FrameFault::Protocol("RSV1 set (no extension was agreed)"));
    }
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0F;
    if compressed && !matches!(opcode, TEXT | BINARY) {
        return Err(FrameFault::Protocol(
            "RSV1 set on a control frame or a continuation",
        ));
    }
    match opcode {
        CONTINUATION | TEXT | BINARY => {}
        CLOSE | PING | PONG => {
            if !fin {
                return Err(FrameFault::Protocol("fragmented control frame"));
            }
        }
        _ => return Err(FrameFault::Protocol("unknown opcode")),
    }
    if b1 & 0x80 == 0 {
        return Err(FrameFault::Protocol("unmasked frame from a client"));
    }
    let (len, len_bytes) = match b1 & 0x7F {
        126 => {
            let Some(b) = buf.get(2..4) else {
                return Ok(None);
            };
            (u64::from(u16::from_be_bytes([b[0], b[1]])), 2)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            let len = u64::from_be_bytes(a);
            if len >> 63 != 0 {
                return Err(FrameFault::Protocol("payload length with its top bit set"));
            }
            (len, 8)
        }
        n => (u64::from(n), 0),
    };
    if opcode & 0x8 != 0 && len > 125 {
        return Err(FrameFault::Protocol("control frame over 125 bytes"));
    }
    let mask_at = 2 + len_bytes;
    let Some(m) = buf.get(mask_at..mask_at + 4) else {
        return Ok(None);
    };
    let payload_len = match usize::try_from(len) {
        Ok(n) if n <= max_payload => n,
        _ => return Err(FrameFault::TooLarge),
    };
    Ok(Some(Header {
        fin,
        compressed,
        opcode,
        mask: [m[0], m[1], m[2], m[3]],
        header_len: mask_at + 4,
        payload_len,
    }))
}

/// XORs `payload` with the frame's mask (its own inverse).
pub(crate) fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let wide = u64::from(word) | (u64::from(word) << 32);
    let mut chunks = payload.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(a) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// The header of an unmasked, final frame of `len` payload bytes; returns
/// the buffer and how many of its bytes are the header. `opcode` may carry
/// [`RSV1`] (a compressed message).
pub(crate) fn server_header(opcode: u8, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    h[0] = 0x80 | opcode;
    if len < 126 {
        h[1] = len as u8;
        (h, 2)
    } else if let Ok(n) = u16::try_from(len) {
        h[1] = 126;
        h[2..4].copy_from_slice(&n.to_be_bytes());
        (h, 4)
    } else {
        h[1] = 127;
        h[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        (h, 10)
    }
}

#[cfg(test)]
pub(crate) mod tests;
