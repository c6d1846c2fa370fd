//! permessage-deflate's negotiation (RFC 7692 section 7.1), pure: the
//! client's offers read from `Sec-WebSocket-Extensions`, the first one the
//! relay can honour accepted, and the answer's header value.
//!
//! The relay always answers `client_no_context_takeover` (section 7.1.1.2
//! lets a server add it to any offer): every client message inflates on
//! its own, with the worker thread's inflater, so no connection keeps an
//! inflate window. It never answers `client_max_window_bits`, so a client
//! compresses with the window it chose. An offer it cannot honour (an
//! unknown or repeated parameter, a bad value, `server_max_window_bits=8`,
//! which zlib's raw deflate cannot produce) is declined; the next is tried,
//! and with none the connection opens uncompressed.

use serde::{Deserialize, Serialize};

/// `server.compression`: what the relay agrees to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// permessage-deflate is never agreed.
    Off,
    /// No context takeover: every message compressed on its own, with the
    /// worker thread's compressor; nothing per connection. A live event's
    /// body is compressed once and shared by its subscribers.
    Stateless,
    /// Context takeover: each connection keeps the last
    /// `server.compression_window_bytes` it sent compressed, and later
    /// messages refer to them.
    Sliding,
}

/// What was agreed for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The relay compresses each message on its own.
    pub server_no_context: bool,
    /// The relay's LZ77 window, in bits (9..=15).
    pub server_window_bits: u8,
}

/// The first acceptable permessage-deflate offer among the header's values,
/// and the answer's header value; `None` when nothing is agreed.
pub fn negotiate<'a>(
    mode: Compression,
    offers: impl Iterator<Item = &'a [u8]>,
) -> Option<(Agreed, String)> {
    if mode == Compression::Off {
        return None;
    }
    for value in offers {
        let Ok(value) = std::str::from_utf8(value) else {
            continue;
        };
        for offer in split_outside_quotes(value, ',') {
            if let Some(agreed) = accept(mode, offer) {
                return Some(agreed);
            }
        }
    }
    None
}

/// One offer (`permessage-deflate; param; param=value`), if it can be
/// honoured.
fn accept(mode: Compression, offer: &str) -> Option<(Agreed, String)> {
    let mut parts = split_outside_quotes(offer, ';');
    let name = parts.next()?.trim();
    if !name.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut seen = [false; 4];
    let mut server_no_context = mode == Compression::Stateless;
    let mut server_bits: Option<u8> = None;
    for param in parts {
        let (key, value) = match param.split_once('=') {
            Some((k, v)) => (k.trim(), Some(unquote(v.trim())?)),
            None => (param.trim(), None),
        };
        let slot = match key.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" => 0,
            "client_no_context_takeover" => 1,
            "server_max_window_bits" => 2,
            "client_max_window_bits" => 3,
            _ => return None,
        };
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        match slot {
            0 | 1 => {
                if value.is_some() {
                    return None;
                }
                if slot == 0 {
                    server_no_context = true;
                }
            }
            2 => {
                let bits = window_bits(value?)?;
                if bits < 9 {
                    return None;
                }
                server_bits = Some(bits);
            }
            _ => {
                // A value is optional; when given it must be valid.
                if let Some(v) = value {
                    window_bits(v)?;
                }
            }
        }
    }
    let mut answer = String::from("permessage-deflate");
    if server_no_context {
        answer.push_str("; server_no_context_takeover");
    }
    answer.push_str("; client_no_context_takeover");
    if let Some(bits) = server_bits {
        answer.push_str(&format!("; server_max_window_bits={bits}"));
    }
    Some((
        Agreed {
            server_no_context,
            server_window_bits: server_bits.unwrap_or(15),
        },
        answer,
    ))
}

/// A window-bits value: 8..=15, digits only, no leading zero.
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.len() > 2 || v.starts_with('0') || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u8 = v.parse().ok()?;
    (8..=15).contains(&n).then_some(n)
}

/// A parameter's value, bare or quoted (RFC 7692 section 7.1: a quoted
/// value must still be a token after unquoting).
fn unquote(v: &str) -> Option<&str> {
    match v.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"')?;
            (!inner.contains(['"', '\\'])).then_some(inner)
        }
        None => (!v.contains('"')).then_some(v),
    }
}

/// Splits on `sep` outside double quotes.
fn split_outside_quotes(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        for (i, c) in s.char_indices() {
            if c == '"' {
                quoted = !quoted;
            } else if c == sep && !quoted {
                rest = Some(&s[i + 1..]);
                return Some(&s[..i]);
            }
        }
        rest = None;
        Some(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nego(mode: Compression, values: &[&str]) -> Option<(Agreed, String)> {
        negotiate(mode, values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn a_plain_offer_is_accepted_with_the_mode_and_no_client_context() {
        let (a, h) = nego(Compression::Sliding, &["permessage-deflate"]).unwrap();
        assert_eq!(h, "permessage-deflate; client_no_context_takeover");
        assert!(!a.server_no_context);
        assert_eq!(a.server_window_bits, 15);
        let (a, h) = nego(Compression::Stateless, &["permessage-deflate"]).unwrap();
        assert_eq!(
            h,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        );
        assert!(a.server_no_context);
        assert!(nego(Compression::Off, &["permessage-deflate"]).is_none());
    }

    #[test]
    fn the_clients_parameters_are_honoured() {
        let (a, h) = nego(
            Compression::Sliding,
            &["permessage-deflate; server_no_context_takeover; client_max_window_bits; server_max_window_bits=10"],
        )
        .unwrap();
        assert!(a.server_no_context);
        assert_eq!(a.server_window_bits, 10);
        assert_eq!(
            h,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10"
        );
        let (a, _) = nego(
            Compression::Sliding,
            &["permessage-deflate; server_max_window_bits=\"12\"; client_max_window_bits=9"],
        )
        .unwrap();
        assert_eq!(a.server_window_bits, 12);
    }

    #[test]
    fn an_offer_that_cannot_be_honoured_is_declined_and_the_next_tried() {
        for bad in [
            "permessage-deflate; server_max_window_bits=8",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=09",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; mystery",
            "x-webkit-deflate-frame",
        ] {
            assert!(nego(Compression::Sliding, &[bad]).is_none(), "{bad}");
            let two = format!("{bad}, permessage-deflate; client_max_window_bits");
            let (a, _) = nego(Compression::Sliding, &[&two]).unwrap();
            assert_eq!(a.server_window_bits, 15, "{two}");
        }
        // Offers in separate header lines count in order too.
        let (a, _) = nego(
            Compression::Sliding,
            &[
                "permessage-deflate; server_max_window_bits=8",
                "permessage-deflate; server_max_window_bits=11",
            ],
        )
        .unwrap();
        assert_eq!(a.server_window_bits, 11);
    }
}
