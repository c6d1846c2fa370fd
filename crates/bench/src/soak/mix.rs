//! What `soak` publishes: a realistic mix of fresh signed events, their
//! `created_at` schedule, and the sizes on the command line.
//!
//! The mix: mostly kind 1 notes (content 100 B to 2 KB, some replying with
//! `e`/`p` tags, some mentioning), kind 7 reactions to recent events, kind 0
//! and 3 (replaceable: one slot per author) and kind 30023 long-form
//! (addressable: a few `d` slots per author, so some are edits). Authors are
//! drawn uniformly, so the first `exempt` of them carry `exempt / authors` of
//! the load. Keys come from the seed: the same seed gives the same authors
//! (and the same first keys whatever `--authors` is), so the exempt pubkeys
//! can be printed before the run and put in the relay's configuration.
//!
//! `created_at` follows the run's progress (0 to 1) over `span` seconds
//! ending at the start of the run, mostly increasing: each event is a random
//! jitter older than its point on the span, and a share of them (`backfill`)
//! are drawn anywhere between the span's start and that point, as events
//! arrive after a sync. The newest events are therefore the last ones
//! generated, and "the newest accepted events" is well defined.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::{Context, bail};
use sluice_proto::event::public_key_of;
use sluice_proto::{Event, KindClass};

use crate::generate::{Spec, tag, text_of_len};
use crate::rng::Rng;
use crate::wire::Prepared;

/// The writers' kind mix, in percent.
pub const SOAK_KIND_MIX: &[(u16, u32)] = &[(1, 66), (7, 24), (0, 3), (3, 3), (30023, 4)];
/// Addressable `d` slots per author: an article written again replaces the last version.
const ARTICLE_SLOTS: u64 = 4;
/// Recent events kept as reply and reaction targets.
const RECENT_EVENTS: usize = 2048;
/// Bytes of an event beyond its content and tag strings (id, pubkey, sig, field names).
const EVENT_OVERHEAD_BYTES: usize = 360;

/// Where `created_at` falls, as the run progresses.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimeSchedule {
    /// The newest possible `created_at` (the run's start, unix seconds).
    pub end: u64,
    /// Seconds before `end` where the span starts.
    pub span_secs: u64,
    /// Most seconds an ordinary event is older than its point on the span.
    pub jitter_secs: u64,
    /// Share of events drawn anywhere between the span's start and their point.
    pub backfill: f64,
}

impl TimeSchedule {
    pub fn start(&self) -> u64 {
        self.end.saturating_sub(self.span_secs)
    }

    /// The point on the span at `progress` (0 to 1).
    pub fn base(&self, progress: f64) -> u64 {
        let p = if progress.is_finite() {
            progress.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.start() + (self.span_secs as f64 * p) as u64
    }

    /// `created_at` of an event generated at `progress`, from two uniform
    /// draws in [0, 1): always in [start, base(progress)].
    pub fn created_at(&self, progress: f64, u1: f64, u2: f64) -> u64 {
        let (start, base) = (self.start(), self.base(progress));
        let back = if u1 < self.backfill {
            ((base - start) as f64 * u2) as u64
        } else {
            (self.jitter_secs as f64 * u2) as u64
        };
        base.saturating_sub(back).max(start)
    }
}

/// A replaceable or addressable slot: one stored version per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub author: u32,
    pub kind: u16,
    /// The `d` tag's index (0 for replaceable kinds).
    pub d: u32,
}

/// What the bench remembers of an event until its OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub created_at: u64,
    pub kind: u16,
    pub bytes: u32,
    pub exempt: bool,
    pub slot: Option<Slot>,
}

/// How much to generate: events, JSON bytes, or both (whichever comes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    pub events: Option<u64>,
    pub bytes: Option<u64>,
}

impl Budget {
    /// How far along `events` and `bytes` are, 0 to 1 (the larger fraction).
    pub fn progress(&self, events: u64, bytes: f64) -> f64 {
        let e = self.events.map_or(0.0, |n| events as f64 / n.max(1) as f64);
        let b = self.bytes.map_or(0.0, |n| bytes / n.max(1) as f64);
        e.max(b).min(1.0)
    }

    pub fn reached(&self, events: u64, bytes: u64) -> bool {
        self.events.is_some_and(|n| events >= n) || self.bytes.is_some_and(|n| bytes >= n)
    }
}

struct Recent {
    id_hex: String,
    pubkey_hex: String,
    kind: u16,
}

/// Makes event specs: a set of authors, a kind mix, a time schedule.
pub struct Mix {
    rng: Rng,
    keys: Arc<[[u8; 32]]>,
    pubkeys: Arc<[String]>,
    /// Index of the first key in the run's numbering of authors.
    first_author: u32,
    exempt: usize,
    kinds: &'static [(u16, u32)],
    schedule: TimeSchedule,
    recent: VecDeque<Recent>,
}

/// `n` author keys from `seed`: the same seed always gives the same keys,
/// and the first `k` keys do not depend on `n`.
pub fn author_keys(seed: u64, n: usize) -> Vec<[u8; 32]> {
    let mut rng = Rng::new(seed).fork(0x50a4);
    (0..n).map(|_| rng.secret_key()).collect()
}

/// The hex pubkeys of the first `n` author keys of `seed`.
pub fn exempt_pubkeys(seed: u64, n: usize) -> Vec<String> {
    author_keys(seed, n)
        .iter()
        .map(|k| hex::encode(public_key_of(k)))
        .collect()
}

impl Mix {
    /// The writers' mix: `authors` keys from `seed`, the first `exempt` of them exempt.
    pub fn writers(seed: u64, authors: usize, exempt: usize, schedule: TimeSchedule) -> Mix {
        Mix::new(
            Rng::new(seed).fork(1),
            author_keys(seed, authors.max(1)),
            0,
            exempt,
            SOAK_KIND_MIX,
            schedule,
        )
    }

    /// A polite client's mix: kind 1 notes by one key of its own, numbered `author`.
    pub fn polite(seed: u64, index: usize, author: u32, schedule: TimeSchedule) -> Mix {
        let mut rng = Rng::new(seed).fork(1000 + index as u64);
        let key = rng.secret_key();
        Mix::new(rng, vec![key], author, 0, &[(1, 1)], schedule)
    }

    fn new(
        rng: Rng,
        keys: Vec<[u8; 32]>,
        first_author: u32,
        exempt: usize,
        kinds: &'static [(u16, u32)],
        schedule: TimeSchedule,
    ) -> Mix {
        let pubkeys: Vec<String> = keys.iter().map(|k| hex::encode(public_key_of(k))).collect();
        Mix {
            rng,
            keys: keys.into(),
            pubkeys: pubkeys.into(),
            first_author,
            exempt,
            kinds,
            schedule,
            recent: VecDeque::new(),
        }
    }

    /// The next event to sign, at `progress` of the run, and what to remember of it
    /// (`bytes` is an estimate until it is signed).
    pub fn spec(&mut self, progress: f64) -> (Spec, Meta) {
        let author = self.rng.below(self.keys.len() as u64) as usize;
        let weights: Vec<u32> = self.kinds.iter().map(|(_, w)| *w).collect();
        let mut kind = self.kinds[self.rng.weighted(&weights)].0;
        if kind == 7 && self.recent.is_empty() {
            kind = 1; // nothing to react to yet
        }
        let (u1, u2) = (self.rng.unit(), self.rng.unit());
        let mut spec = Spec {
            secret_key: self.keys[author],
            created_at: self.schedule.created_at(progress, u1, u2),
            kind,
            tags: Vec::new(),
            content: String::new(),
        };
        let mut d = 0;
        match kind {
            0 => self.metadata(&mut spec),
            3 => self.contacts(&mut spec),
            7 => self.reaction(&mut spec),
            30023 => d = self.long_form(&mut spec),
            _ => self.note(&mut spec),
        }
        let author_id = self.first_author + author as u32;
        let slot = match KindClass::of(kind) {
            KindClass::Replaceable | KindClass::Addressable => Some(Slot {
                author: author_id,
                kind,
                d,
            }),
            _ => None,
        };
        let meta = Meta {
            created_at: spec.created_at,
            kind,
            bytes: estimate_bytes(&spec) as u32,
            exempt: author < self.exempt,
            slot,
        };
        (spec, meta)
    }

    /// Keeps a signed event as a target for later replies and reactions.
    pub fn remember(&mut self, ev: &Event) {
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(Recent {
            id_hex: ev.id_hex(),
            pubkey_hex: hex::encode(ev.pubkey),
            kind: ev.kind,
        });
    }

    fn target(&mut self) -> Option<(String, String, u16)> {
        if self.recent.is_empty() {
            return None;
        }
        let back = self.rng.skewed(self.recent.len() as u64) as usize;
        let t = &self.recent[self.recent.len() - 1 - back];
        Some((t.id_hex.clone(), t.pubkey_hex.clone(), t.kind))
    }

    fn random_pubkey(&mut self) -> String {
        let i = self.rng.below(self.pubkeys.len() as u64) as usize;
        self.pubkeys[i].clone()
    }

    fn note(&mut self, spec: &mut Spec) {
        let len = 100 + self.rng.exp_capped(400.0, 1900) as usize;
        spec.content = text_of_len(&mut self.rng, len);
        if self.rng.chance(0.35)
            && let Some((id, pk, _)) = self.target()
        {
            spec.tags.push(tag(&["e", &id, "", "root"]));
            spec.tags.push(tag(&["p", &pk]));
        }
        if self.rng.chance(0.15) {
            for _ in 0..self.rng.range(1, 3) {
                let pk = self.random_pubkey();
                spec.tags.push(tag(&["p", &pk]));
            }
        }
    }

    fn reaction(&mut self, spec: &mut Spec) {
        if let Some((id, pk, k)) = self.target() {
            spec.tags = vec![
                tag(&["e", &id]),
                tag(&["p", &pk]),
                tag(&["k", &k.to_string()]),
            ];
        }
        spec.content = if self.rng.chance(0.7) { "+" } else { "🤙" }.into();
    }

    fn metadata(&mut self, spec: &mut Spec) {
        let name = text_of_len(&mut self.rng, 8).replace(['.', ' '], "_");
        let len = 40 + self.rng.exp_capped(160.0, 800) as usize;
        let about = text_of_len(&mut self.rng, len);
        spec.content = serde_json::json!({
            "name": name,
            "about": about,
            "picture": format!("https://avatars.example.com/{:016x}.png", self.rng.next_u64()),
            "nip05": format!("{name}@example.com"),
        })
        .to_string();
    }

    fn contacts(&mut self, spec: &mut Spec) {
        for _ in 0..self.rng.exp_capped(60.0, 500).max(1) {
            let pk = self.random_pubkey();
            spec.tags.push(tag(&["p", &pk]));
        }
    }

    /// Fills a long-form article; returns its `d` slot.
    fn long_form(&mut self, spec: &mut Spec) -> u32 {
        let d = self.rng.below(ARTICLE_SLOTS) as u32;
        let len = 10 + self.rng.below(60) as usize;
        let title = text_of_len(&mut self.rng, len);
        spec.tags = vec![
            tag(&["d", &format!("soak-article-{d}")]),
            tag(&["title", &title]),
            tag(&["published_at", &spec.created_at.to_string()]),
        ];
        let len = 500 + self.rng.exp_capped(2500.0, 12_000) as usize;
        spec.content = format!("# {title}\n\n{}", text_of_len(&mut self.rng, len));
        d
    }
}

/// About how many JSON bytes a spec signs into (content and tags may grow
/// with escapes; the run counts the real size once signed).
pub fn estimate_bytes(spec: &Spec) -> usize {
    let tags: usize = spec
        .tags
        .iter()
        .map(|t| t.iter().map(|s| s.len() + 3).sum::<usize>() + 2)
        .sum();
    EVENT_OVERHEAD_BYTES + spec.content.len() + tags
}

/// The `["EVENT",…]` message of a signed event.
pub fn prepared(ev: &Event) -> Prepared {
    Prepared {
        id: ev.id,
        message: format!("[\"EVENT\",{}]", ev.raw()).into(),
    }
}

/// A byte size: a number with an optional K, M, G or T suffix (binary
/// multiples; `B`, `iB` and lowercase accepted): `1G`, `512MiB`, `1.5g`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    parse_scaled(s, 1024.0)
}

/// A count: a number with an optional K, M or G suffix (decimal multiples): `2M`.
pub fn parse_count(s: &str) -> anyhow::Result<u64> {
    parse_scaled(s, 1000.0)
}

fn parse_scaled(s: &str, step: f64) -> anyhow::Result<u64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, power) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1),
        Some('m') => (&body[..body.len() - 1], 2),
        Some('g') => (&body[..body.len() - 1], 3),
        Some('t') => (&body[..body.len() - 1], 4),
        _ => (body, 0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("not a size or count: {s:?} (e.g. 500M, 1G, 2000)"))?;
    if !v.is_finite() || v < 0.0 {
        bail!("not a size or count: {s:?}");
    }
    let v = v * step.powi(power);
    if v >= u64::MAX as f64 {
        bail!("too large: {s:?}");
    }
    Ok(v.round() as u64)
}

#[cfg(test)]
mod tests;
