//! The opening handshake's checks (RFC 6455 section 4.2.1), pure: a
//! request's method and headers, its `Sec-WebSocket-Accept`, and
//! permessage-deflate agreed from its offers. Taking the connection over
//! is the HTTP server's part (`sluice-server`).

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, header};
use sha1::{Digest, Sha1};

use crate::extension::{self, Agreed, Compression};

/// The GUID of RFC 6455 section 1.3.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A valid upgrade request's answer: `Sec-WebSocket-Accept`, and
/// permessage-deflate when an offer was accepted, with the answer's
/// `Sec-WebSocket-Extensions`.
#[derive(Debug)]
pub struct Accepted {
    pub accept: HeaderValue,
    pub deflate: Option<(Agreed, HeaderValue)>,
}

/// Why an upgrade request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 400, saying what is wrong.
    BadRequest(&'static str),
    /// 426 with `Sec-WebSocket-Version: 13`.
    Version,
}

/// Whether the request asks for a WebSocket at all (`Upgrade: websocket`);
/// one that does not is an ordinary HTTP request.
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    has_token(headers, header::UPGRADE, "websocket")
}

/// Checks an upgrade request and agrees permessage-deflate if it is
/// offered and `compression` allows it.
pub fn check(
    method: &Method,
    headers: &HeaderMap,
    compression: Compression,
) -> Result<Accepted, Refused> {
    let bad = Refused::BadRequest;
    if method != Method::GET {
        return Err(bad("a WebSocket upgrade is a GET\n"));
    }
    if !headers.contains_key(header::HOST) {
        return Err(bad("Host is missing\n"));
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err(bad("Connection: upgrade is missing\n"));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(Refused::Version);
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(bad("Sec-WebSocket-Key is missing\n"));
    };
    let key_ok = base64::engine::general_purpose::STANDARD
        .decode(key.as_bytes())
        .is_ok_and(|k| k.len() == 16);
    if !key_ok {
        return Err(bad("Sec-WebSocket-Key is not 16 bytes in base64\n"));
    }
    let deflate = negotiate(compression, headers)
        .and_then(|(agreed, answer)| Some((agreed, HeaderValue::from_str(&answer).ok()?)));
    Ok(Accepted {
        accept: accept_key(key.as_bytes()),
        deflate,
    })
}

/// permessage-deflate agreed from the request's offers, if any.
fn negotiate(compression: Compression, headers: &HeaderMap) -> Option<(Agreed, String)> {
    let offers = headers
        .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
        .iter()
        .map(HeaderValue::as_bytes);
    extension::negotiate(compression, offers)
}

/// The `Sec-WebSocket-Extensions` answer to a request's offers (for the
/// fuzz targets).
pub(crate) fn extension_answer(compression: Compression, headers: &HeaderMap) -> Option<String> {
    negotiate(compression, headers).map(|(_, answer)| answer)
}

/// `Sec-WebSocket-Accept` for a key.
fn accept_key(key: &[u8]) -> HeaderValue {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(GUID);
    let encoded = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    // Base64 is always a valid header value.
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_key_of_the_rfc_example() {
        // RFC 6455 section 1.3.
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn request() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("relay.example"));
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        h.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        h
    }

    #[test]
    fn requests_are_checked() {
        let h = request();
        assert!(wants_upgrade(&h));
        let ok = check(&Method::GET, &h, Compression::Sliding).unwrap();
        assert_eq!(ok.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(ok.deflate.is_none(), "nothing offered, nothing agreed");
        let mut offer = request();
        offer.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static("permessage-deflate"),
        );
        let (_, answer) = check(&Method::GET, &offer, Compression::Sliding)
            .unwrap()
            .deflate
            .unwrap();
        assert_eq!(answer, "permessage-deflate; client_no_context_takeover");
        assert!(
            check(&Method::GET, &offer, Compression::Off)
                .unwrap()
                .deflate
                .is_none()
        );
        assert!(matches!(
            check(&Method::POST, &h, Compression::Sliding),
            Err(Refused::BadRequest(_))
        ));
        let mut v = request();
        v.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        assert_eq!(
            check(&Method::GET, &v, Compression::Sliding).err(),
            Some(Refused::Version)
        );
        let mut no_host = request();
        no_host.remove(header::HOST);
        assert!(matches!(
            check(&Method::GET, &no_host, Compression::Sliding),
            Err(Refused::BadRequest(_))
        ));
        for (name, value) in [
            (header::CONNECTION, "keep-alive"),
            (header::SEC_WEBSOCKET_KEY, "c2hvcnQ="),
        ] {
            let mut b = request();
            b.insert(name, HeaderValue::from_static(value));
            let r = check(&Method::GET, &b, Compression::Sliding).err();
            assert!(matches!(r, Some(Refused::BadRequest(_))), "{r:?}");
        }
        let mut plain = request();
        plain.remove(header::UPGRADE);
        assert!(!wants_upgrade(&plain));
    }
}
