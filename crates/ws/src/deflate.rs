//! permessage-deflate's data (RFC 7692 section 7.2): messages compressed
//! for a connection ([`Deflater`]) and client messages inflated
//! ([`inflate`]), with the worker thread's compressors and inflater.
//!
//! A connection keeps no compressor. In `sliding` mode it keeps the last
//! bytes it sent compressed (its window, at most
//! `server.compression_window_bytes`, made at its first compressed
//! message); each message is compressed by the thread's compressor primed
//! with that window (`deflateSetDictionary`), so it may refer to them, as
//! the client's inflater holds them. Windows together are bounded
//! (`server.compression_windows_mb`): past it a connection gets none and
//! its messages are compressed on their own, which the RFC allows (the
//! relay may always refer to less than the client keeps). In `stateless`
//! mode nothing is kept, and a message made of parts compresses its shared
//! part once, into a slot the caller keeps with it ([`Deflater::spliced`]).
//!
//! The inflated size of a client message is bounded as it inflates: past
//! the bound inflating stops, with at most the bound held.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use flate2::{Compress, Decompress, FlushCompress, FlushDecompress, Status};

use crate::WsError;
use crate::extension::Agreed;
use crate::metrics_names as metric;

/// The trailer every sync flush ends with, taken off a message (section
/// 7.2.1) and put back before inflating (section 7.2.2).
const TRAILER: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// How messages are compressed (`[server]`).
#[derive(Debug, Clone, Copy)]
pub struct DeflateSettings {
    /// zlib level, 1..=9.
    pub level: u8,
    /// Shorter messages are sent uncompressed.
    pub min_bytes: u32,
    /// The window a connection keeps in `sliding` mode.
    pub window_bytes: u32,
}

/// The bytes every connection's window holds together, and their bound.
#[derive(Debug)]
pub struct WindowBudget {
    held: AtomicUsize,
    max: usize,
}

impl WindowBudget {
    pub fn new(max: usize) -> Arc<WindowBudget> {
        Arc::new(WindowBudget {
            held: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes `n` bytes of the budget, if it has them.
    fn take(&self, n: usize) -> bool {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            if held + n > self.max {
                return false;
            }
            match self.held.compare_exchange_weak(
                held,
                held + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    metrics::gauge!(metric::WINDOW_BYTES).increment(n as f64);
                    return true;
                }
                Err(now) => held = now,
            }
        }
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
        metrics::gauge!(metric::WINDOW_BYTES).decrement(n as f64);
    }

    /// Bytes held now (for tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// A connection's window: the last bytes it sent compressed, its budget
/// given back on drop.
struct Window {
    bytes: Vec<u8>,
    budget: Arc<WindowBudget>,
}

impl Drop for Window {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes.capacity());
    }
}

impl Window {
    /// Keeps the last `capacity` bytes of what was sent, `text` included.
    fn push(&mut self, parts: &[&[u8]]) {
        let cap = self.bytes.capacity();
        for part in parts {
            if part.len() >= cap {
                self.bytes.clear();
                self.bytes.extend_from_slice(&part[part.len() - cap..]);
                continue;
            }
            let over = (self.bytes.len() + part.len()).saturating_sub(cap);
            self.bytes.drain(..over);
            self.bytes.extend_from_slice(part);
        }
    }
}

/// One connection's side of permessage-deflate.
pub struct Deflater {
    agreed: Agreed,
    settings: DeflateSettings,
    budget: Arc<WindowBudget>,
    /// `sliding` only; made at the first compressed message.
    window: Option<Window>,
    /// The budget refused a window: messages go on compressed alone.
    no_window: bool,
}

thread_local! {
    /// The worker thread's compressors, by window bits (9..=15) and level.
    static COMPRESSORS: RefCell<Vec<(u8, u8, Box<Compress>)>> = const { RefCell::new(Vec::new()) };
    static INFLATER: RefCell<Option<Box<Decompress>>> = const { RefCell::new(None) };
}

impl Deflater {
    pub fn new(agreed: Agreed, settings: DeflateSettings, budget: Arc<WindowBudget>) -> Deflater {
        Deflater {
            agreed,
            settings,
            budget,
            window: None,
            no_window: false,
        }
    }

    /// Whether a message of `len` bytes is sent compressed.
    pub fn wants(&self, len: usize) -> bool {
        len >= self.settings.min_bytes as usize
    }

    /// Bytes this connection holds for compression (for tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.window.as_ref().map_or(0, |w| w.bytes.capacity())
    }

    fn window_cap(&self) -> usize {
        if self.agreed.server_no_context {
            return 0;
        }
        (self.settings.window_bytes as usize).min(1 << self.agreed.server_window_bits)
    }

    /// Compresses the message made of `parts` (in order), appending the
    /// payload to `out` (the trailer taken off).
    pub fn compress(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) {
        let cap = self.window_cap();
        if cap > 0 && self.window.is_none() && !self.no_window {
            if self.budget.take(cap) {
                self.window = Some(Window {
                    bytes: Vec::with_capacity(cap),
                    budget: self.budget.clone(),
                });
            } else {
                self.no_window = true;
                metrics::counter!(metric::WINDOWS_REFUSED_TOTAL).increment(1);
            }
        }
        let bits = self.agreed.server_window_bits;
        let dictionary = self.window.as_ref().map(|w| &w.bytes[..]);
        with_compressor(bits, self.settings.level, |c| {
            if let Some(d) = dictionary.filter(|d| !d.is_empty()) {
                // Right after a reset: allowed for raw deflate.
                let _ = c.set_dictionary(d);
            }
            let last = parts.len().saturating_sub(1);
            for (i, part) in parts.iter().enumerate() {
                let flush = if i == last {
                    FlushCompress::Sync
                } else {
                    FlushCompress::None
                };
                run(c, part, out, flush);
            }
        });
        strip_trailer(out);
        if let Some(w) = self.window.as_mut() {
            w.push(parts);
        }
        count_out(parts.iter().map(|p| p.len()).sum(), out.len());
    }

    /// Whether [`Deflater::spliced`] applies: messages are compressed on
    /// their own, so a shared part may be compressed once.
    pub fn splices(&self) -> bool {
        self.agreed.server_no_context
    }

    /// Appends the compressed payload of `prefix + body + suffix` to `out`
    /// when each message is compressed on its own: `body` is compressed
    /// once into `shared` (kept by the caller with the body: a live event's
    /// slot, filled by its first subscriber) when the window is the RFC's
    /// default, since a DEFLATE stream ending in a sync flush stands alone
    /// and blocks made apart can follow each other; the short parts around
    /// it go in stored blocks.
    pub fn spliced(
        &mut self,
        prefix: &[u8],
        body: &[u8],
        shared: &OnceLock<Box<[u8]>>,
        suffix: &[u8],
        out: &mut Vec<u8>,
    ) {
        stored_block(prefix, out);
        let level = self.settings.level;
        let bits = self.agreed.server_window_bits;
        let alone = |out: &mut Vec<u8>| {
            with_compressor(bits, level, |c| run(c, body, out, FlushCompress::Sync));
        };
        if bits == 15 {
            let z = shared.get_or_init(|| {
                let mut z = Vec::with_capacity(body.len() / 2 + 64);
                alone(&mut z);
                z.into_boxed_slice()
            });
            out.extend_from_slice(z);
        } else {
            alone(out);
        }
        stored_block(suffix, out);
        // The empty stored block a message must end with, less its trailer.
        out.push(0x00);
        count_out(prefix.len() + body.len() + suffix.len(), out.len());
    }
}

fn count_out(plain: usize, wire: usize) {
    metrics::counter!(metric::DEFLATE_BYTES_TOTAL, "stage" => "plain").increment(plain as u64);
    metrics::counter!(metric::DEFLATE_BYTES_TOTAL, "stage" => "compressed").increment(wire as u64);
}

/// A non-final stored block holding `bytes` (at most 65535).
fn stored_block(bytes: &[u8], out: &mut Vec<u8>) {
    for chunk in bytes.chunks(0xFFFF) {
        let n = chunk.len() as u16;
        out.push(0x00);
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&(!n).to_le_bytes());
        out.extend_from_slice(chunk);
    }
}

fn strip_trailer(out: &mut Vec<u8>) {
    if out.ends_with(&TRAILER) {
        out.truncate(out.len() - TRAILER.len());
    }
}

/// Runs `f` with the thread's compressor for these window bits and level,
/// reset.
fn with_compressor<T>(bits: u8, level: u8, f: impl FnOnce(&mut Compress) -> T) -> T {
    COMPRESSORS.with_borrow_mut(|all| {
        let at = match all.iter().position(|(b, l, _)| *b == bits && *l == level) {
            Some(i) => i,
            None => {
                let c = Compress::new_with_window_bits(
                    flate2::Compression::new(level.into()),
                    false,
                    bits,
                );
                all.push((bits, level, Box::new(c)));
                all.len() - 1
            }
        };
        let c = &mut all[at].2;
        c.reset();
        f(c)
    })
}

/// Compresses all of `input` into `out` with `flush` at its end.
fn run(c: &mut Compress, input: &[u8], out: &mut Vec<u8>, flush: FlushCompress) {
    let start = c.total_in();
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.len().max(input.len() / 2 + 64));
        }
        let done = (c.total_in() - start) as usize;
        // The stream is made here and fed whole: no error is possible but a
        // bug, which would show as a client's decode failure.
        if c.compress_vec(&input[done..], out, flush).is_err() {
            return;
        }
        let consumed = (c.total_in() - start) as usize == input.len();
        // Finished once all input is in and the output had room to spare.
        if consumed && (matches!(flush, FlushCompress::None) || out.len() < out.capacity()) {
            return;
        }
    }
}

/// Inflates one client message (no context takeover: each on its own),
/// refusing it once it would inflate past `max` bytes.
pub fn inflate(payload: &[u8], max: usize) -> Result<Vec<u8>, WsError> {
    if payload.is_empty() {
        // Some clients send an empty message as no bytes at all.
        return Ok(Vec::new());
    }
    INFLATER.with_borrow_mut(|slot| {
        let d = slot.get_or_insert_with(|| Box::new(Decompress::new(false)));
        d.reset(false);
        let mut out: Vec<u8> = Vec::with_capacity((payload.len() * 4).max(256).min(max + 1));
        for input in [payload, &TRAILER[..]] {
            let start = d.total_in();
            loop {
                let done = (d.total_in() - start) as usize;
                if out.len() == out.capacity() {
                    if out.len() > max {
                        metrics::counter!(metric::INFLATE_TOO_LARGE_TOTAL).increment(1);
                        return Err(WsError::TooLarge);
                    }
                    out.reserve((out.len()).min(max + 1 - out.len()).max(256));
                }
                let status = d
                    .decompress_vec(&input[done..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| WsError::Protocol("invalid compressed data"))?;
                if out.len() > max {
                    metrics::counter!(metric::INFLATE_TOO_LARGE_TOTAL).increment(1);
                    return Err(WsError::TooLarge);
                }
                let consumed = (d.total_in() - start) as usize == input.len();
                match status {
                    Status::StreamEnd => break,
                    _ if consumed && out.len() < out.capacity() => break,
                    Status::BufError if out.len() < out.capacity() => {
                        return Err(WsError::Protocol("invalid compressed data"));
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests;
