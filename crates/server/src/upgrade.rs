//! The opening handshake on the relay's URL: the request checked by
//! `sluice_ws::handshake`, the 101 answer, and the TCP socket taken back
//! from hyper once it is sent (the session speaks RFC 6455 on it with
//! `sluice_ws`).

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sluice_ws::extension::{Agreed, Compression};
use sluice_ws::handshake::{self, Accepted};
use tokio::net::TcpStream;

/// A valid upgrade request: its answer, and the socket to come.
pub(crate) struct Upgrade {
    accepted: Accepted,
    on_upgrade: OnUpgrade,
}

/// Why an upgrade request is refused; [`Refused::into_response`] is the
/// HTTP answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Against RFC 6455 section 4.2.1.
    Checks(handshake::Refused),
    /// 426: the connection cannot be taken over (not HTTP/1.1 upgradable).
    CannotUpgrade,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Checks(handshake::Refused::BadRequest(why)) => {
                (StatusCode::BAD_REQUEST, why).into_response()
            }
            Refused::Checks(handshake::Refused::Version) => {
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

impl Upgrade {
    /// Checks an upgrade request and agrees permessage-deflate if it is
    /// offered and `compression` allows it; the error is the HTTP answer.
    pub(crate) fn check(
        method: &Method,
        headers: &HeaderMap,
        on_upgrade: Option<OnUpgrade>,
        compression: Compression,
    ) -> Result<Upgrade, Refused> {
        let accepted = handshake::check(method, headers, compression).map_err(Refused::Checks)?;
        let Some(on_upgrade) = on_upgrade else {
            return Err(Refused::CannotUpgrade);
        };
        Ok(Upgrade {
            accepted,
            on_upgrade,
        })
    }

    /// The 101 answer, the upgrade to await once it is returned, and what
    /// was agreed of permessage-deflate.
    pub(crate) fn respond(self) -> (Response, OnUpgrade, Option<Agreed>) {
        let mut r = StatusCode::SWITCHING_PROTOCOLS.into_response();
        let h = r.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::SEC_WEBSOCKET_ACCEPT, self.accepted.accept);
        let agreed = self.accepted.deflate.map(|(agreed, answer)| {
            h.insert(header::SEC_WEBSOCKET_EXTENSIONS, answer);
            agreed
        });
        (r, self.on_upgrade, agreed)
    }
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
    fn refusals_answer_with_their_status() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            (header::HOST, "relay.example"),
            (header::UPGRADE, "websocket"),
            (header::CONNECTION, "Upgrade"),
            (header::SEC_WEBSOCKET_VERSION, "13"),
            (header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ=="),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        // Good headers pass every check up to the upgrade itself.
        let r = Upgrade::check(&Method::GET, &h, None, Compression::Sliding)
            .err()
            .unwrap();
        assert_eq!(r, Refused::CannotUpgrade);
        assert_eq!(r.into_response().status(), StatusCode::UPGRADE_REQUIRED);
        let r = Upgrade::check(&Method::POST, &h, None, Compression::Sliding)
            .err()
            .unwrap();
        assert_eq!(r.into_response().status(), StatusCode::BAD_REQUEST);
        h.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        let r = Upgrade::check(&Method::GET, &h, None, Compression::Sliding)
            .err()
            .unwrap()
            .into_response();
        assert_eq!(r.status(), StatusCode::UPGRADE_REQUIRED);
        assert_eq!(r.headers()[header::SEC_WEBSOCKET_VERSION], "13");
    }
}
