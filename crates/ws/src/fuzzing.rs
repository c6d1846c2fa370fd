//! Entry points for the fuzz targets (`fuzz/`). Not an API: nothing else
//! calls these.

use futures_util::FutureExt;
use http::{HeaderMap, Method};

use crate::Message;
use crate::extension::Compression;
use crate::handshake::{Refused, check, extension_answer};
use crate::read::WsRead;

/// A message as the reader gave it, or its error, as text: `text <the
/// text>`, `binary <length>`, `ping <payload in hex>`, `close` (no body) or
/// `close <code> <reason>`.
pub type Read = Result<String, String>;

/// The error [`read_messages`] ends with when the reader waited for more
/// bytes on a byte slice, which it must never do.
pub const WAITED: &str = "the reader waited on a byte slice";

/// Every message the server-side reader gives for `bytes` (a client's
/// stream after the upgrade), until it ends or fails. `deflate`:
/// permessage-deflate agreed. The reader never waits on a byte slice, so
/// each step completes at once.
pub fn read_messages(bytes: &[u8], max_message: usize, deflate: bool) -> Vec<Read> {
    read_messages_with(bytes, max_message, deflate, 4096)
}

/// [`read_messages`] with the reader taking at most `read_size` bytes from
/// the stream at once (at least a frame header's 14), so that frames are
/// split across reads anywhere.
pub fn read_messages_with(
    bytes: &[u8],
    max_message: usize,
    deflate: bool,
    read_size: usize,
) -> Vec<Read> {
    let mut reader = WsRead::new(bytes, &[], max_message, read_size, deflate);
    let mut out = Vec::new();
    loop {
        let Some(step) = reader.next().now_or_never() else {
            out.push(Err(WAITED.into()));
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
        Message::Ping(p) => format!(
            "ping {}",
            p.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        Message::Close(None) => "close".into(),
        Message::Close(Some(c)) => format!("close {} {}", c.code, c.reason),
    }
}

/// An upgrade request's checks (101 when it may upgrade, else the
/// refusal's status) and the `Sec-WebSocket-Extensions` answer for its
/// offers in each mode.
pub fn check_upgrade(method: &Method, headers: &HeaderMap) -> (u16, [Option<String>; 3]) {
    let status = match check(method, headers, Compression::Sliding) {
        Ok(_) => 101,
        Err(Refused::BadRequest(_)) => 400,
        Err(Refused::Version) => 426,
    };
    let modes = [
        Compression::Off,
        Compression::Stateless,
        Compression::Sliding,
    ];
    (status, modes.map(|mode| extension_answer(mode, headers)))
}
