//! A subscription's filters as the live index keeps them: one allocation of
//! bytes per subscription instead of a `Filter` (152 bytes) and a block per
//! list and per tag value. The index holds one for every open subscription,
//! idle ones included.
//!
//! Matching reads the bytes in place and decides exactly as
//! [`Filter::matches`]: the same conditions, and every list searched by the
//! same binary search over the same values in the same order. A filter's
//! NIP-50 `search` is not packed: the hub keeps it beside ([`Packed::pack`]
//! hands it back), and a packed filter only says it has one.
//!
//! Layout, integers little-endian; `int` is 2 bytes, or 4 or 8 when a
//! count or length does not fit in fewer (the first byte says which):
//! ```text
//! width: u8, filters: int, then per filter:
//!   flags: u8 (IDS, AUTHORS, KINDS, SINCE, UNTIL, SEARCH)
//!   since: u64 (if SINCE), until: u64 (if UNTIL)
//!   ids: int n, n × 32 bytes (if IDS); authors likewise (if AUTHORS)
//!   kinds: int n, n × u16 (if KINDS)
//!   tags: int n, then per tag: letter u8, values int n, bytes int len,
//!         n × (start int, end int) into the bytes, the bytes
//! ```

use sluice_proto::{Event, Filter, Search};

const IDS: u8 = 1;
const AUTHORS: u8 = 2;
const KINDS: u8 = 4;
const SINCE: u8 = 8;
const UNTIL: u8 = 16;
const SEARCH: u8 = 32;

/// The NIP-50 searches of a subscription's filters, by position.
pub(super) type Searches = Box<[Option<Box<Search>>]>;

/// One subscription's filters, packed.
pub(super) struct Packed(Box<[u8]>);

impl Packed {
    /// Packs `filters`; their searches are given back by position (`None`
    /// when no filter has one).
    pub(super) fn pack(filters: &[Filter]) -> (Packed, Option<Searches>) {
        let width = [2, 4].into_iter().find(|&w| fits(filters, w)).unwrap_or(8);
        Packed::pack_as(filters, width)
    }

    /// [`Packed::pack`] with integers of `width` bytes (2, 4 or 8).
    pub(super) fn pack_as(filters: &[Filter], width: u8) -> (Packed, Option<Searches>) {
        let mut w = Writer {
            out: Vec::new(),
            width,
        };
        w.out.push(width);
        w.int(filters.len());
        for f in filters {
            w.filter(f);
        }
        let searches = filters
            .iter()
            .any(|f| f.search.is_some())
            .then(|| filters.iter().map(|f| f.search.clone()).collect());
        (Packed(w.out.into_boxed_slice()), searches)
    }

    /// Bytes per `int` (for tests).
    #[cfg(test)]
    pub(super) fn width(&self) -> u8 {
        self.0.first().copied().unwrap_or(0)
    }

    /// The filters, in order.
    pub(super) fn filters(&self) -> Filters<'_> {
        let mut r = Reader {
            bytes: &self.0[1..],
            width: self.0.first().copied().unwrap_or(8),
        };
        let left = r.int();
        Filters { r, left }
    }
}

/// Whether every count and length of `filters` fits in `width` bytes.
fn fits(filters: &[Filter], width: u8) -> bool {
    let fits = |n: usize| width >= 8 || (n as u64) >> (8 * u32::from(width)) == 0;
    fits(filters.len())
        && filters.iter().all(|f| {
            [
                f.ids.as_ref().map(Vec::len),
                f.authors.as_ref().map(Vec::len),
            ]
            .into_iter()
            .chain([f.kinds.as_ref().map(Vec::len), Some(f.tags.len())])
            .all(|n| n.is_none_or(fits))
                && f.tags.iter().all(|(_, values)| {
                    fits(values.len()) && fits(values.iter().map(String::len).sum::<usize>())
                })
        })
}

struct Writer {
    out: Vec<u8>,
    width: u8,
}

impl Writer {
    /// `n` in `width` bytes (`fits` checked every count and length).
    fn int(&mut self, n: usize) {
        let bytes = (n as u64).to_le_bytes();
        self.out
            .extend_from_slice(&bytes[..usize::from(self.width).min(8)]);
    }

    fn filter(&mut self, f: &Filter) {
        let mut flags = 0;
        for (present, flag) in [
            (f.ids.is_some(), IDS),
            (f.authors.is_some(), AUTHORS),
            (f.kinds.is_some(), KINDS),
            (f.since.is_some(), SINCE),
            (f.until.is_some(), UNTIL),
            (f.search.is_some(), SEARCH),
        ] {
            if present {
                flags |= flag;
            }
        }
        self.out.push(flags);
        for t in [f.since, f.until].into_iter().flatten() {
            self.out.extend_from_slice(&t.to_le_bytes());
        }
        for keys in [&f.ids, &f.authors].into_iter().flatten() {
            self.int(keys.len());
            self.out.extend(keys.iter().flatten());
        }
        if let Some(kinds) = &f.kinds {
            self.int(kinds.len());
            self.out.extend(kinds.iter().flat_map(|k| k.to_le_bytes()));
        }
        self.int(f.tags.len());
        for (letter, values) in &f.tags {
            self.out.push(*letter);
            self.int(values.len());
            self.int(values.iter().map(String::len).sum());
            let mut at = 0;
            for v in values {
                self.int(at);
                at += v.len();
                self.int(at);
            }
            for v in values {
                self.out.extend_from_slice(v.as_bytes());
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Reader<'a> {
    bytes: &'a [u8],
    /// Bytes per `int`: 2, 4 or 8.
    width: u8,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(n.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    /// `N` bytes (zeros past the end, which a packing never leaves short).
    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let got = self.take(N);
        out[..got.len()].copy_from_slice(got);
        out
    }

    fn byte(&mut self) -> u8 {
        self.fixed::<1>()[0]
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.fixed())
    }

    fn int(&mut self) -> usize {
        let n = match self.width {
            2 => u64::from(u16::from_le_bytes(self.fixed())),
            4 => u64::from(u32::from_le_bytes(self.fixed())),
            _ => self.u64(),
        };
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// `n` items of `N` bytes each.
    fn items<const N: usize>(&mut self) -> &'a [[u8; N]] {
        let n = self.int();
        self.take(n.saturating_mul(N)).as_chunks::<N>().0
    }
}

/// The filters of a [`Packed`], in order.
pub(super) struct Filters<'a> {
    r: Reader<'a>,
    left: usize,
}

impl<'a> Iterator for Filters<'a> {
    type Item = View<'a>;

    fn next(&mut self) -> Option<View<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = &mut self.r;
        let flags = r.byte();
        let since = (flags & SINCE != 0).then(|| r.u64());
        let until = (flags & UNTIL != 0).then(|| r.u64());
        let ids = (flags & IDS != 0).then(|| r.items::<32>());
        let authors = (flags & AUTHORS != 0).then(|| r.items::<32>());
        let kinds = (flags & KINDS != 0).then(|| r.items::<2>());
        let count = r.int();
        let start = *r;
        for _ in 0..count {
            Tag::read(r);
        }
        Some(View {
            search: flags & SEARCH != 0,
            since,
            until,
            ids,
            authors,
            kinds,
            tags: Tags { r: start, count },
        })
    }
}

/// One packed filter.
pub(super) struct View<'a> {
    /// It has a `search`, kept by the hub.
    pub(super) search: bool,
    since: Option<u64>,
    until: Option<u64>,
    pub(super) ids: Option<&'a [[u8; 32]]>,
    pub(super) authors: Option<&'a [[u8; 32]]>,
    pub(super) kinds: Option<&'a [[u8; 2]]>,
    pub(super) tags: Tags<'a>,
}

impl View<'_> {
    /// [`Filter::is_empty_match`].
    pub(super) fn is_empty_match(&self) -> bool {
        self.ids.is_some_and(<[_]>::is_empty)
            || self.authors.is_some_and(<[_]>::is_empty)
            || self.kinds.is_some_and(<[_]>::is_empty)
            || self.tags.clone().any(|t| t.is_empty())
            || matches!((self.since, self.until), (Some(s), Some(u)) if s > u)
    }

    /// [`Filter::matches`] but the search, which the caller checks.
    pub(super) fn matches(&self, ev: &Event) -> bool {
        self.since.is_none_or(|s| ev.created_at >= s)
            && self.until.is_none_or(|u| ev.created_at <= u)
            && self.ids.is_none_or(|ids| ids.binary_search(&ev.id).is_ok())
            && self
                .authors
                .is_none_or(|a| a.binary_search(&ev.pubkey).is_ok())
            && self.kinds.is_none_or(|k| {
                k.binary_search_by(|x| u16::from_le_bytes(*x).cmp(&ev.kind))
                    .is_ok()
            })
            && self.tags.clone().all(|tag| {
                ev.indexed_tags()
                    .any(|(l, v)| l == tag.letter && tag.contains(v))
            })
    }
}

/// A packed filter's tag conditions, in order.
#[derive(Clone)]
pub(super) struct Tags<'a> {
    r: Reader<'a>,
    count: usize,
}

impl<'a> Iterator for Tags<'a> {
    type Item = Tag<'a>;

    fn next(&mut self) -> Option<Tag<'a>> {
        if self.count == 0 {
            return None;
        }
        self.count -= 1;
        Some(Tag::read(&mut self.r))
    }
}

/// One tag condition: its letter and its values (sorted as the filter's).
pub(super) struct Tag<'a> {
    pub(super) letter: u8,
    /// Bytes per `int` of its spans.
    width: u8,
    spans: &'a [u8],
    bytes: &'a [u8],
}

impl<'a> Tag<'a> {
    fn read(r: &mut Reader<'a>) -> Tag<'a> {
        let letter = r.byte();
        let n = r.int();
        let len = r.int();
        let pair = 2 * usize::from(r.width);
        let spans = r.take(n.saturating_mul(pair));
        let bytes = r.take(len);
        Tag {
            letter,
            width: r.width,
            spans,
            bytes,
        }
    }

    /// How many values.
    pub(super) fn len(&self) -> usize {
        self.spans.len() / self.span_len()
    }

    fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn span_len(&self) -> usize {
        2 * usize::from(self.width)
    }

    /// The values, in order.
    pub(super) fn values(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.spans
            .chunks_exact(self.span_len())
            .map(|s| self.value(span(s)))
    }

    fn value(&self, (start, end): (usize, usize)) -> &'a str {
        self.bytes
            .get(start..end)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    /// Whether `v` is one of the values: the filter's binary search.
    fn contains(&self, v: &str) -> bool {
        match self.width {
            2 => self.search::<4>(v),
            4 => self.search::<8>(v),
            _ => self.search::<16>(v),
        }
    }

    /// The binary search over spans of `P` bytes.
    fn search<const P: usize>(&self, v: &str) -> bool {
        self.spans
            .as_chunks::<P>()
            .0
            .binary_search_by(|s| self.value(span(s)).cmp(v))
            .is_ok()
    }
}

/// A value's (start, end) in its tag's bytes, from its packed span.
fn span(s: &[u8]) -> (usize, usize) {
    let mut r = Reader {
        bytes: s,
        width: u8::try_from(s.len() / 2).unwrap_or(8),
    };
    (r.int(), r.int())
}
