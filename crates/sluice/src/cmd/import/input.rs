//! Input of `sluice import`: opening each source (a file or standard
//! input), recognising gzip and zstd by their magic bytes, and splitting the
//! decompressed stream into lines of bounded length, grouped in chunks.
//!
//! Invariants: no line held in memory is longer than the limit (the rest of
//! an overlong line is skipped without being buffered); every line keeps its
//! 1-based number within its source; a read error ends that source and is
//! reported as a line of its own, never dropped silently.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Buffer of the decompressed stream the line splitter reads from.
const LINE_BUFFER_BYTES: usize = 1 << 20;

/// One input: a file, or standard input when `path` is `None`.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: Option<PathBuf>,
}

impl Source {
    /// How messages name this source.
    pub fn name(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "<stdin>".to_string(),
        }
    }

    /// Size in bytes when it is a regular file (for the progress ETA).
    pub fn size_bytes(&self) -> Option<u64> {
        let meta = std::fs::metadata(self.path.as_ref()?).ok()?;
        meta.is_file().then_some(meta.len())
    }
}

/// How the bytes of a source are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Plain,
    Gzip,
    Zstd,
}

/// Recognises the encoding from the first bytes of a stream.
pub fn sniff(head: &[u8]) -> io::Result<Encoding> {
    match head {
        [0x1f, 0x8b, ..] => Ok(Encoding::Gzip),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Ok(Encoding::Zstd),
        [0xfd, b'7', b'z', b'X', ..] => Err(unsupported("xz")),
        [b'B', b'Z', b'h', ..] => Err(unsupported("bzip2")),
        _ => Ok(Encoding::Plain),
    }
}

fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{what} input is not supported: decompress it first (e.g. `{what} -dc FILE | sluice import`)"
        ),
    )
}

/// Counts the bytes read from the underlying (possibly compressed) source,
/// so progress is measured against the file size.
struct Counting<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A source's decompressed bytes, buffered.
pub type Stream = BufReader<Box<dyn Read + Send>>;

/// Opens `source` and returns its decompressed bytes.
pub fn open(source: &Source, bytes_read: Arc<AtomicU64>) -> io::Result<Stream> {
    let raw: Box<dyn Read + Send> = match &source.path {
        Some(p) => Box::new(File::open(p)?),
        None => Box::new(io::stdin()),
    };
    let mut raw = Counting {
        inner: raw,
        bytes: bytes_read,
    };
    // Read the magic bytes, then put them back in front of the stream.
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match raw.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let stream = Cursor::new(head[..got].to_vec()).chain(raw);
    let decoded: Box<dyn Read + Send> = match sniff(&head[..got])? {
        Encoding::Plain => Box::new(stream),
        // Multi-member, as pigz and concatenated dumps write it.
        Encoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(stream)),
        Encoding::Zstd => Box::new(zstd::stream::read::Decoder::new(stream)?),
    };
    Ok(BufReader::with_capacity(LINE_BUFFER_BYTES, decoded))
}

/// What the splitter found at one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineKind {
    /// A line ended by `\n`.
    Complete,
    /// The last line of the source, without a final newline: complete if it
    /// parses, else a truncated dump.
    NoNewline,
    /// Longer than the limit; `len_bytes` were skipped, none kept.
    TooLong { len_bytes: u64 },
    /// The source could not be read past this point.
    ReadError(String),
}

/// One line of a chunk: its number in its source and its bytes in the
/// chunk's buffer (empty unless `Complete` or `NoNewline`).
#[derive(Debug, Clone)]
pub struct Line {
    pub number: u64,
    pub start: usize,
    pub end: usize,
    pub kind: LineKind,
}

/// Splits a stream into lines of at most `max_bytes`.
pub struct LineSplitter<R> {
    inner: BufReader<R>,
    max_bytes: usize,
    number: u64,
}

impl<R: Read> LineSplitter<R> {
    pub fn new(inner: BufReader<R>, max_bytes: usize) -> Self {
        Self {
            inner,
            max_bytes,
            number: 0,
        }
    }

    /// True when the next line needs a read from the source, which may
    /// block (a pipe): the caller hands on what it has first.
    pub fn buffer_is_empty(&self) -> bool {
        self.inner.buffer().is_empty()
    }

    /// Number of the last line returned.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Appends the next line's bytes (without the newline) to `buf` and
    /// describes it; `None` at the end of the stream.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<Line>> {
        let start = buf.len();
        let mut len: u64 = 0;
        let mut too_long = false;
        let newline = loop {
            let avail = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    buf.truncate(start);
                    return Err(e);
                }
            };
            if avail.is_empty() {
                if len == 0 && !too_long {
                    return Ok(None);
                }
                break false;
            }
            let (take, found) = match memchr::memchr(b'\n', avail) {
                Some(i) => (i, true),
                None => (avail.len(), false),
            };
            if !too_long {
                if len as usize + take > self.max_bytes {
                    too_long = true;
                    buf.truncate(start);
                } else {
                    buf.extend_from_slice(&avail[..take]);
                }
            }
            len += take as u64;
            self.inner.consume(take + usize::from(found));
            if found {
                break true;
            }
        };
        self.number += 1;
        let kind = if too_long {
            LineKind::TooLong { len_bytes: len }
        } else if newline {
            LineKind::Complete
        } else {
            LineKind::NoNewline
        };
        Ok(Some(Line {
            number: self.number,
            start,
            end: buf.len(),
            kind,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &[u8], max: usize) -> Vec<(u64, Vec<u8>, LineKind)> {
        let mut s = LineSplitter::new(BufReader::with_capacity(3, text), max);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while let Some(l) = s.next_into(&mut buf).unwrap() {
            out.push((l.number, buf[l.start..l.end].to_vec(), l.kind));
        }
        out
    }

    #[test]
    fn lines_numbers_and_final_line_without_newline() {
        let got = split(b"ab\n\ncd\nef", 10);
        assert_eq!(
            got,
            vec![
                (1, b"ab".to_vec(), LineKind::Complete),
                (2, b"".to_vec(), LineKind::Complete),
                (3, b"cd".to_vec(), LineKind::Complete),
                (4, b"ef".to_vec(), LineKind::NoNewline),
            ]
        );
        assert_eq!(split(b"ab\n", 10).len(), 1);
        assert!(split(b"", 10).is_empty());
    }

    #[test]
    fn overlong_lines_are_skipped_not_buffered() {
        let got = split(b"0123456789abc\nok\n0123456789", 5);
        assert_eq!(got[0], (1, vec![], LineKind::TooLong { len_bytes: 13 }));
        assert_eq!(got[1], (2, b"ok".to_vec(), LineKind::Complete));
        assert_eq!(got[2], (3, vec![], LineKind::TooLong { len_bytes: 10 }));
        // Exactly at the limit is fine.
        assert_eq!(split(b"12345\n", 5)[0].2, LineKind::Complete);
    }

    #[test]
    fn magic_bytes() {
        assert_eq!(sniff(&[0x1f, 0x8b, 8, 0]).unwrap(), Encoding::Gzip);
        assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd]).unwrap(), Encoding::Zstd);
        assert_eq!(sniff(b"{\"id").unwrap(), Encoding::Plain);
        assert_eq!(sniff(b"").unwrap(), Encoding::Plain);
        assert!(sniff(b"BZh9").is_err());
    }
}
