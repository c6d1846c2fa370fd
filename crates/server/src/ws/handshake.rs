//! The opening handshake (RFC 6455 section 4.2): the request's checks, the
//! 101 answer, and the TCP socket taken back from hyper once it is sent.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sha1::{Digest, Sha1};
use tokio::net::TcpStream;

use super::extension::{self, Agreed, Compression};

/// The GUID of RFC 6455 section 1.3.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A valid upgrade request: its answer's key, and the socket to come.
pub(crate) struct Upgrade {
    accept: HeaderValue,
    on_upgrade: OnUpgrade,
    /// permessage-deflate, when an offer was accepted, and the answer's
    /// `Sec-WebSocket-Extensions`.
    deflate: Option<(Agreed, HeaderValue)>,
}

/// Why an upgrade request is refused; [`Refused::into_response`] is the
/// HTTP answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// 400, saying what is wrong.
    BadRequest(&'static str),
    /// 426 with `Sec-WebSocket-Version: 13`.
    Version,
    /// 426: the connection cannot be taken over (not HTTP/1.1 upgradable).
    CannotUpgrade,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::BadRequest(why) => (StatusCode::BAD_REQUEST, why).into_response(),
            Refused::Version => {
                let mut r =
                    (StatusCode::UPGRADE_REQUIRED, "WebSocket version 13 only\n").into_response();
                r.headers_mut().insert(
                    header::SEC_WEBSOCKET_VERSION,
                    HeaderValue::from_static("13"),
                );
                r
            }
            Refused::CannotUpgrade => (
                StatusCode::UPGRADE_REQUIRED,
                "this connection cannot upgrade\n",
            )
                .into_response(),
        }
    }
}

/// Whether the request asks for a WebSocket at all (`Upgrade: websocket`);
/// one that does not is an ordinary HTTP request.
pub(crate) fn wants_upgrade(headers: &HeaderMap) -> bool {
    has_token(headers, header::UPGRADE, "websocket")
}

impl Upgrade {
    /// Checks an upgrade request and agrees permessage-deflate if it is
    /// offered and `compression` allows it; the error is the HTTP answer.
    pub(crate) fn check(
        method: &Method,
        headers: &HeaderMap,
        on_upgrade: Option<OnUpgrade>,
        compression: Compression,
    ) -> Result<Upgrade, Refused> {
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
        let Some(on_upgrade) = on_upgrade else {
            return Err(Refused::CannotUpgrade);
        };
        let deflate = negotiate(compression, headers)
            .and_then(|(agreed, answer)| Some((agreed, HeaderValue::from_str(&answer).ok()?)));
        Ok(Upgrade {
            accept: accept_key(key.as_bytes()),
            on_upgrade,
            deflate,
        })
    }

    /// The 101 answer, the upgrade to await once it is returned, and what
    /// was agreed of permessage-deflate.
    pub(crate) fn respond(self) -> (Response, OnUpgrade, Option<Agreed>) {
        let mut r = StatusCode::SWITCHING_PROTOCOLS.into_response();
        let h = r.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::SEC_WEBSOCKET_ACCEPT, self.accept);
        let agreed = self.deflate.map(|(agreed, answer)| {
            h.insert(header::SEC_WEBSOCKET_EXTENSIONS, answer);
            agreed
        });
        (r, self.on_upgrade, agreed)
    }
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

/// The upgraded connection's socket, and the bytes hyper had read past
/// the request (the client may send its first frame at once).
pub(crate) async fn take_socket(on_upgrade: OnUpgrade) -> Option<(TcpStream, bytes::Bytes)> {
    let upgraded = match on_upgrade.await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed");
            return None;
        }
    };
    match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => Some((parts.io.into_inner(), parts.read_buf)),
        Err(_) => {
            tracing::error!("an upgraded connection is not a TCP socket");
            None
        }
    }
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
    fn requests_are_checked_before_the_upgrade() {
        let h = request();
        assert!(wants_upgrade(&h));
        // Good headers pass every check up to the upgrade itself.
        let r = Upgrade::check(&Method::GET, &h, None, Compression::Sliding)
            .err()
            .unwrap();
        assert_eq!(r, Refused::CannotUpgrade);
        assert_eq!(r.into_response().status(), StatusCode::UPGRADE_REQUIRED);
        assert!(matches!(
            Upgrade::check(&Method::POST, &h, None, Compression::Sliding)
                .err()
                .unwrap(),
            Refused::BadRequest(_)
        ));
        let mut v = request();
        v.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        let r = Upgrade::check(&Method::GET, &v, None, Compression::Sliding)
            .err()
            .unwrap()
            .into_response();
        assert_eq!(r.status(), StatusCode::UPGRADE_REQUIRED);
        assert_eq!(r.headers()[header::SEC_WEBSOCKET_VERSION], "13");
        let mut no_host = request();
        no_host.remove(header::HOST);
        assert!(matches!(
            Upgrade::check(&Method::GET, &no_host, None, Compression::Sliding),
            Err(Refused::BadRequest(_))
        ));
        for (name, value) in [
            (header::CONNECTION, "keep-alive"),
            (header::SEC_WEBSOCKET_KEY, "c2hvcnQ="),
        ] {
            let mut b = request();
            b.insert(name, HeaderValue::from_static(value));
            let r = Upgrade::check(&Method::GET, &b, None, Compression::Sliding)
                .err()
                .unwrap();
            assert!(matches!(r, Refused::BadRequest(_)), "{r:?}");
        }
        let mut plain = request();
        plain.remove(header::UPGRADE);
        assert!(!wants_upgrade(&plain));
    }
}
