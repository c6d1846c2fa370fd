//! `gen`: deterministic, realistic signed events.
//!
//! The output is a pure function of (seed, count, authors, start time, span):
//! the same arguments always produce the same JSONL, byte for byte, whatever
//! the thread count. Events come in batches; an event only refers (reply,
//! reaction, repost, zap, comment) to events of earlier batches, so each batch
//! can be signed in parallel while ids stay deterministic. Memory is bounded:
//! only a ring of recent events is kept as reference targets.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use sluice_proto::Event;
use sluice_proto::event::public_key_of;

use crate::rng::Rng;

/// The kind mix, in percent: roughly what public relays see.
pub const KIND_MIX: &[(u16, u32)] = &[
    (1, 55),
    (7, 20),
    (6, 5),
    (1111, 4),
    (0, 3),
    (3, 3),
    (4, 3),
    (9735, 3),
    (10002, 2),
    (30023, 2),
];

/// Events generated (and signed) together; references point only at earlier batches.
const BATCH_EVENTS: usize = 512;
/// Recent events kept as reply, reaction and repost targets.
const RECENT_EVENTS: usize = 4096;
/// Services that sign zap receipts (kind 9735).
const ZAPPERS: usize = 3;

const WORDS: &[&str] = &[
    "the",
    "a",
    "relay",
    "nostr",
    "good",
    "morning",
    "coffee",
    "bitcoin",
    "just",
    "think",
    "about",
    "this",
    "is",
    "what",
    "we",
    "need",
    "more",
    "of",
    "open",
    "protocol",
    "freedom",
    "speech",
    "people",
    "build",
    "today",
    "tomorrow",
    "love",
    "it",
    "not",
    "sure",
    "why",
    "zap",
    "note",
    "client",
    "keys",
    "sign",
    "everything",
    "simple",
    "fast",
    "slow",
    "time",
    "world",
    "city",
    "music",
    "photo",
    "art",
    "code",
    "rust",
    "bug",
    "fix",
    "ship",
    "and",
    "but",
    "or",
    "so",
    "very",
    "really",
    "new",
    "old",
    "network",
    "social",
    "media",
    "post",
    "thread",
    "reply",
    "follow",
    "feed",
    "home",
    "work",
    "weekend",
    "sunny",
    "rain",
    "walk",
    "read",
    "book",
    "idea",
    "question",
    "answer",
    "yes",
    "no",
    "maybe",
    "great",
    "thanks",
];

const TOPICS: &[&str] = &[
    "nostr",
    "bitcoin",
    "grownostr",
    "art",
    "photography",
    "music",
    "food",
    "coffee",
    "plebchain",
    "zapathon",
    "dev",
    "rust",
    "lightning",
    "privacy",
    "freedom",
    "news",
    "memes",
    "gm",
    "travel",
    "books",
    "science",
    "health",
    "running",
    "cats",
    "dogs",
    "gaming",
    "movies",
    "crypto",
    "economics",
    "history",
    "philosophy",
    "nature",
];

/// What `gen` is asked for.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub seed: u64,
    pub count: u64,
    pub authors: usize,
    /// created_at of the first event (unix seconds).
    pub start_time: u64,
    /// Events spread evenly over this many seconds after `start_time`.
    pub span_secs: u64,
    pub threads: usize,
}

/// An event before signing.
#[derive(Debug, Clone)]
pub struct Spec {
    pub secret_key: [u8; 32],
    pub created_at: u64,
    pub kind: u16,
    pub tags: Vec<Vec<String>>,
    pub content: String,
}

struct Author {
    secret_key: [u8; 32],
    pubkey_hex: String,
}

struct Recent {
    id_hex: String,
    pubkey_hex: String,
    kind: u16,
    raw: Arc<str>,
}

/// Produces events batch by batch.
pub struct Generator {
    cfg: GenConfig,
    rng: Rng,
    authors: Vec<Author>,
    zappers: Vec<Author>,
    recent: VecDeque<Recent>,
    produced: u64,
}

fn make_authors(rng: &mut Rng, n: usize) -> Vec<Author> {
    (0..n)
        .map(|_| {
            let secret_key = rng.secret_key();
            let pubkey_hex = hex::encode(public_key_of(&secret_key));
            Author {
                secret_key,
                pubkey_hex,
            }
        })
        .collect()
}

impl Generator {
    pub fn new(cfg: GenConfig) -> Generator {
        let mut rng = Rng::new(cfg.seed);
        let authors = make_authors(&mut rng, cfg.authors.max(1));
        let zappers = make_authors(&mut rng, ZAPPERS);
        Generator {
            cfg,
            rng,
            authors,
            zappers,
            recent: VecDeque::new(),
            produced: 0,
        }
    }

    /// The next batch of signed events; empty when `count` have been produced.
    pub fn next_batch(&mut self) -> Vec<Event> {
        let n = (self.cfg.count - self.produced).min(BATCH_EVENTS as u64);
        let specs: Vec<Spec> = (0..n).map(|_| self.next_spec()).collect();
        let events = sign_parallel(specs, self.cfg.threads);
        for ev in &events {
            self.remember(ev);
        }
        events
    }

    fn remember(&mut self, ev: &Event) {
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(Recent {
            id_hex: ev.id_hex(),
            pubkey_hex: hex::encode(ev.pubkey),
            kind: ev.kind,
            raw: ev.raw().into(),
        });
    }

    fn created_at(&self) -> u64 {
        let span = u128::from(self.cfg.span_secs);
        let offset = span * u128::from(self.produced) / u128::from(self.cfg.count.max(1));
        self.cfg.start_time + offset as u64
    }

    fn next_spec(&mut self) -> Spec {
        let created_at = self.created_at();
        self.produced += 1;
        let author = self.rng.skewed(self.authors.len() as u64) as usize;
        let secret_key = self.authors[author].secret_key;
        let weights: Vec<u32> = KIND_MIX.iter().map(|(_, w)| *w).collect();
        let mut kind = KIND_MIX[self.rng.weighted(&weights)].0;
        if self.recent.is_empty() && matches!(kind, 6 | 7 | 1111 | 9735) {
            kind = 1; // nothing to point at yet
        }
        let mut spec = Spec {
            secret_key,
            created_at,
            kind,
            tags: Vec::new(),
            content: String::new(),
        };
        self.fill(&mut spec);
        spec
    }

    fn fill(&mut self, spec: &mut Spec) {
        match spec.kind {
            0 => self.metadata(spec),
            3 => self.contacts(spec),
            4 => self.direct_message(spec),
            6 => self.repost(spec),
            7 => self.reaction(spec),
            1111 => self.comment(spec),
            9735 => self.zap_receipt(spec),
            10002 => self.relay_list(spec),
            30023 => self.long_form(spec),
            _ => self.note(spec),
        }
    }

    fn target(&mut self) -> &Recent {
        let back = self.rng.skewed(self.recent.len() as u64) as usize;
        &self.recent[self.recent.len() - 1 - back]
    }

    fn random_pubkey(&mut self) -> String {
        let i = self.rng.below(self.authors.len() as u64) as usize;
        self.authors[i].pubkey_hex.clone()
    }

    fn text(&mut self, mean: f64, max: u64) -> String {
        let len = self.rng.exp_capped(mean, max).max(1) as usize;
        text_of_len(&mut self.rng, len)
    }

    fn topic(&mut self) -> &'static str {
        TOPICS[self.rng.skewed(TOPICS.len() as u64) as usize]
    }

    fn note(&mut self, spec: &mut Spec) {
        spec.content = self.text(380.0, 4000);
        if !self.recent.is_empty() && self.rng.chance(0.35) {
            let t = self.target();
            let (id, pk) = (t.id_hex.clone(), t.pubkey_hex.clone());
            spec.tags.push(tag(&["e", &id, "", "root"]));
            spec.tags.push(tag(&["p", &pk]));
        }
        if self.rng.chance(0.2) {
            for _ in 0..self.rng.range(1, 3) {
                let t = self.topic();
                spec.content.push_str(&format!(" #{t}"));
                spec.tags.push(tag(&["t", t]));
            }
        }
        if self.rng.chance(0.15) {
            for _ in 0..self.rng.range(1, 3) {
                let pk = self.random_pubkey();
                spec.tags.push(tag(&["p", &pk]));
            }
        }
        if self.rng.chance(0.1) {
            let n = self.rng.next_u64();
            spec.content
                .push_str(&format!(" https://image.example.com/{n:016x}.jpg"));
        }
    }

    fn reaction(&mut self, spec: &mut Spec) {
        let t = self.target();
        let (id, pk, k) = (t.id_hex.clone(), t.pubkey_hex.clone(), t.kind.to_string());
        spec.tags = vec![tag(&["e", &id]), tag(&["p", &pk]), tag(&["k", &k])];
        spec.content = if self.rng.chance(0.7) {
            "+".into()
        } else {
            "🤙".into()
        };
    }

    fn repost(&mut self, spec: &mut Spec) {
        let t = self.target();
        let (id, pk, raw) = (t.id_hex.clone(), t.pubkey_hex.clone(), t.raw.clone());
        spec.tags = vec![
            tag(&["e", &id, "wss://relay.example.com"]),
            tag(&["p", &pk]),
        ];
        spec.content = raw.to_string();
    }

    fn comment(&mut self, spec: &mut Spec) {
        let t = self.target();
        let (id, pk, k) = (t.id_hex.clone(), t.pubkey_hex.clone(), t.kind.to_string());
        spec.tags = vec![
            tag(&["E", &id, "", &pk]),
            tag(&["K", &k]),
            tag(&["P", &pk]),
            tag(&["e", &id, "", &pk]),
            tag(&["k", &k]),
            tag(&["p", &pk]),
        ];
        spec.content = self.text(180.0, 2000);
    }

    fn metadata(&mut self, spec: &mut Spec) {
        let name = self.text(8.0, 20).replace(' ', "_");
        let about = self.text(160.0, 1000);
        let n = self.rng.next_u64();
        spec.content = serde_json::json!({
            "name": name,
            "display_name": name,
            "about": about,
            "picture": format!("https://avatars.example.com/{n:016x}.png"),
            "nip05": format!("{name}@example.com"),
            "lud16": format!("{name}@wallet.example.com"),
        })
        .to_string();
    }

    fn contacts(&mut self, spec: &mut Spec) {
        let follows = self.rng.exp_capped(60.0, 800).max(1);
        for _ in 0..follows {
            let pk = self.random_pubkey();
            spec.tags.push(tag(&["p", &pk]));
        }
    }

    fn direct_message(&mut self, spec: &mut Spec) {
        let pk = self.random_pubkey();
        spec.tags.push(tag(&["p", &pk]));
        let len = self.rng.exp_capped(200.0, 4000).max(16) as usize;
        spec.content = format!(
            "{}?iv={}",
            base64ish(&mut self.rng, len),
            base64ish(&mut self.rng, 24)
        );
    }

    fn zap_receipt(&mut self, spec: &mut Spec) {
        let z = self.rng.below(ZAPPERS as u64) as usize;
        spec.secret_key = self.zappers[z].secret_key;
        let t = self.target();
        let (id, pk) = (t.id_hex.clone(), t.pubkey_hex.clone());
        let amount = self.rng.range(1, 100) * 1000;
        let request = serde_json::json!({
            "kind": 9734, "content": "", "created_at": spec.created_at,
            "tags": [["p", pk], ["e", id], ["amount", amount.to_string()],
                     ["relays", "wss://relay.example.com"]],
            "pubkey": self.random_pubkey(), "id": hex::encode(self.rng.bytes32()),
            "sig": hex::encode([self.rng.bytes32(), self.rng.bytes32()].concat()),
        });
        let bolt11 = format!(
            "lnbc{}n1{}",
            amount / 1000,
            base64ish(&mut self.rng, 300).to_lowercase()
        );
        spec.tags = vec![
            tag(&["p", &pk]),
            tag(&["e", &id]),
            tag(&["bolt11", &bolt11]),
            tag(&["description", &request.to_string()]),
            tag(&["preimage", &hex::encode(self.rng.bytes32())]),
        ];
    }

    fn relay_list(&mut self, spec: &mut Spec) {
        for _ in 0..self.rng.range(2, 8) {
            let url = format!("wss://relay{}.example.com", self.rng.below(50));
            let marker = ["", "read", "write"][self.rng.below(3) as usize];
            let mut t = tag(&["r", &url]);
            if !marker.is_empty() {
                t.push(marker.to_owned());
            }
            spec.tags.push(t);
        }
    }

    fn long_form(&mut self, spec: &mut Spec) {
        let slug = format!("article-{:08x}", self.rng.next_u64() as u32);
        let title = self.text(40.0, 120);
        spec.tags = vec![
            tag(&["d", &slug]),
            tag(&["title", &title]),
            tag(&["published_at", &spec.created_at.to_string()]),
        ];
        for _ in 0..self.rng.range(1, 4) {
            let t = self.topic();
            spec.tags.push(tag(&["t", t]));
        }
        spec.content = format!("# {title}\n\n{}", self.text(2500.0, 20_000));
    }
}

pub(crate) fn tag(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// Words from the word list, about `len` bytes long.
pub fn text_of_len(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        if !s.is_empty() {
            s.push(if rng.chance(0.08) { '.' } else { ' ' });
        }
        s.push_str(WORDS[rng.skewed(WORDS.len() as u64) as usize]);
    }
    s
}

fn base64ish(rng: &mut Rng, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    (0..len)
        .map(|_| ALPHABET[rng.below(64) as usize] as char)
        .collect()
}

/// Signs specs on up to `threads` threads, keeping their order.
pub fn sign_parallel(specs: Vec<Spec>, threads: usize) -> Vec<Event> {
    let threads = threads.max(1);
    let chunk = specs.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(sign_spec).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("signing thread panicked"))
            .collect()
    })
}

fn sign_spec(s: &Spec) -> Event {
    Event::sign(
        &s.secret_key,
        s.created_at,
        s.kind,
        s.tags.clone(),
        &s.content,
    )
}

/// What `gen` reports.
#[derive(Debug, Serialize)]
pub struct GenReport {
    pub seed: u64,
    pub count: u64,
    pub authors: usize,
    pub start_time: u64,
    pub span_secs: u64,
    pub bytes: u64,
    pub mean_event_bytes: f64,
    pub kinds: BTreeMap<u16, u64>,
    pub elapsed_secs: f64,
}

/// Writes `cfg.count` events as JSONL to `out`.
pub fn write_jsonl(cfg: &GenConfig, out: &mut dyn Write) -> anyhow::Result<GenReport> {
    let started = Instant::now();
    let mut generator = Generator::new(cfg.clone());
    let (mut bytes, mut kinds) = (0u64, BTreeMap::new());
    loop {
        let batch = generator.next_batch();
        if batch.is_empty() {
            break;
        }
        for ev in &batch {
            out.write_all(ev.raw().as_bytes())?;
            out.write_all(b"\n")?;
            bytes += ev.raw().len() as u64;
            *kinds.entry(ev.kind).or_insert(0) += 1;
        }
    }
    out.flush()?;
    Ok(GenReport {
        seed: cfg.seed,
        count: cfg.count,
        authors: cfg.authors,
        start_time: cfg.start_time,
        span_secs: cfg.span_secs,
        bytes,
        mean_event_bytes: bytes as f64 / cfg.count.max(1) as f64,
        kinds,
        elapsed_secs: started.elapsed().as_secs_f64(),
    })
}

impl GenReport {
    pub fn print(&self) {
        println!(
            "gen: {} events from {} authors (seed {}, start-time {}, span {} s) in {:.1} s",
            self.count, self.authors, self.seed, self.start_time, self.span_secs, self.elapsed_secs
        );
        println!(
            "  {} bytes, mean {:.0} bytes/event",
            self.bytes, self.mean_event_bytes
        );
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        println!("  kinds: {}", kinds.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(seed: u64, count: u64, threads: usize) -> GenConfig {
        GenConfig {
            seed,
            count,
            authors: 50,
            start_time: 1_700_000_000,
            span_secs: 3600,
            threads,
        }
    }

    fn jsonl(c: &GenConfig) -> (Vec<u8>, GenReport) {
        let mut out = Vec::new();
        let report = write_jsonl(c, &mut out).unwrap();
        (out, report)
    }

    #[test]
    fn same_seed_same_output_whatever_the_threads() {
        let (a, _) = jsonl(&cfg(9, 700, 1));
        let (b, _) = jsonl(&cfg(9, 700, 2));
        assert_eq!(a, b);
        let (c, _) = jsonl(&cfg(10, 700, 2));
        assert_ne!(a, c);
    }

    #[test]
    fn every_event_verifies_and_references_earlier_events() {
        let (out, _) = jsonl(&cfg(1, 1200, 2));
        let mut seen = std::collections::HashSet::new();
        for line in std::str::from_utf8(&out).unwrap().lines() {
            let ev = Event::parse(line).unwrap();
            ev.verify().unwrap();
            for t in ev.tags.iter().filter(|t| t[0] == "e" && ev.kind != 9735) {
                assert!(seen.contains(&t[1]), "e tag must point at an earlier event");
            }
            assert!(seen.insert(ev.id_hex()));
        }
        assert_eq!(seen.len(), 1200);
    }

    #[test]
    fn kind_mix_and_size_are_roughly_as_specified() {
        let (_, report) = jsonl(&cfg(3, 5000, 2));
        let share = |k: u16| *report.kinds.get(&k).unwrap_or(&0) as f64 / 5000.0;
        for (kind, percent) in KIND_MIX {
            let want = f64::from(*percent) / 100.0;
            let got = share(*kind);
            assert!(
                (got - want).abs() < want * 0.35 + 0.01,
                "kind {kind}: {got} vs {want}"
            );
        }
        assert!(
            (600.0..1600.0).contains(&report.mean_event_bytes),
            "{}",
            report.mean_event_bytes
        );
    }

    #[test]
    fn created_at_stays_in_the_span() {
        let (out, _) = jsonl(&cfg(4, 300, 1));
        for line in std::str::from_utf8(&out).unwrap().lines() {
            let ev = Event::parse(line).unwrap();
            assert!((1_700_000_000..=1_700_003_600).contains(&ev.created_at));
        }
    }
}
