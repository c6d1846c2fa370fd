//! Entry points for the fuzz targets (`fuzz/`) into the WebSocket layer,
//! which is otherwise private to the crate. Not an API: nothing else calls
//! these.

use axum::http::{HeaderMap, Method};
use futures_util::FutureExt;

use crate::config::Compression;
use crate::ws::{Message, Upgrade, WsRead, extension_answer};

/// A message as the reader gave it, or its error, as text.
pub type Read = Result<String, String>;

/// Every message the server-side reader gives for `bytes` (a client's
/// stream after the upgrade), until it ends or fails. `deflate`:
/// permessage-deflate agreed. The reader never waits on a byte slice, so
/// each step completes at once.
pub fn read_messages(bytes: &[u8], max_message: usize, deflate: bool) -> Vec<Read> {
    let mut reader = WsRead::new(bytes, &[], max_message, 4096, deflate);
    let mut out = Vec::new();
    loop {
        let Some(step) = reader.next().now_or_never() else {
            out.push(Err("the reader waited on a byte slice".into()));
            return out;
        };
        match step {
            None => return out,
            Some(Ok(m)) => out.push(Ok(describe(&m))),
            Some(Err(e)) => {
                out.push(Err(e.to_string()));
                return out;
            }
        }
    }
}

fn describe(m: &Message) -> String {
    match m {
        Message::Text(t) => format!("text {t}"),
        Message::Binary(n) => format!("binary {n}"),
        Message::Ping(p) => format!("ping {p:?}"),
        Message::Close(c) => format!("close {c:?}"),
    }
}

/// An upgrade request's checks (the answer's status, or 101) and the
/// `Sec-WebSocket-Extensions` answer for its offers in each mode.
pub fn check_upgrade(method: &Method, headers: &HeaderMap) -> (u16, [Option<String>; 3]) {
    use axum::response::IntoResponse;
    let status = match Upgrade::check(method, headers, None, Compression::Sliding) {
        Ok(_) => 101,
        Err(refused) => refused.into_response().status().as_u16(),
    };
    let modes = [
        Compression::Off,
        Compression::Stateless,
        Compression::Sliding,
    ];
    (status, modes.map(|mode| extension_answer(mode, headers)))
}
