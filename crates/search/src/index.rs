//! The tantivy index: its schema, the tokeniser (the proto crate's
//! [`sluice_proto::search::words`], so the index and `Filter::matches`
//! agree), the documents made from events, and the ranked search of one
//! filter.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_proto::Filter;
use sluice_proto::search::{TextParts, for_each_word, language_of, text_of};
use sluice_store::StoredRef;
use tantivy::directory::MmapDirectory;
use tantivy::query::{AllQuery, BooleanQuery, Occur, Query, RangeQuery, TermQuery, TermSetQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{Token, TokenStream, Tokenizer};
use tantivy::{DocAddress, Index, IndexReader, ReloadPolicy, Searcher, TantivyDocument, Term};

use crate::config::SearchConfig;
use crate::metrics_names as m;
use crate::rank::{Ranked, RankedHit};

/// The tokeniser's name in the index.
const WORDS: &str = "sluice_words";

/// Postings a search walks for the cost of one row read from the store:
/// a posting is a few bits decoded and scored, a row an LMDB lookup and an
/// event loaded.
pub const POSTINGS_PER_ROW: u64 = 16;

/// Most removals waiting for the indexer; more are dropped (counted) and
/// found again by a later search.
const MAX_PENDING_REMOVALS: usize = 4096;

/// Errors of the index.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("search index: {0}")]
    Index(#[from] tantivy::TantivyError),
    #[error("search index directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("search index directory {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("store: {0}")]
    Store(#[from] sluice_store::StoreError),
    /// Another process (a relay serving this store) holds the index's
    /// writer: it indexes what is stored, this one need not.
    #[error("search index {path} is being written by another process")]
    Busy { path: PathBuf },
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields {
    pub serial: Field,
    pub created_at: Field,
    pub kind: Field,
    pub pubkey: Field,
    pub language: Field,
    pub text: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let serial = b.add_u64_field("serial", INDEXED | FAST);
    let created_at = b.add_u64_field("created_at", FAST);
    let kind = b.add_u64_field("kind", INDEXED);
    let pubkey = b.add_bytes_field("pubkey", INDEXED);
    let language = b.add_text_field("language", STRING);
    let text = b.add_text_field(
        "text",
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(WORDS)
                .set_index_option(IndexRecordOption::WithFreqs),
        ),
    );
    (
        b.build(),
        Fields {
            serial,
            created_at,
            kind,
            pubkey,
            language,
            text,
        },
    )
}

/// [`for_each_word`] as a tantivy tokeniser: a text's words are kept in
/// one buffer, each token lent from it in turn (no allocation per word).
#[derive(Clone, Default)]
struct WordTokenizer {
    words: String,
    spans: Vec<Span>,
}

/// A word: where it starts in the text, and its bytes in
/// [`WordTokenizer::words`].
#[derive(Clone, Copy)]
struct Span {
    offset: usize,
    start: usize,
    end: usize,
}

struct WordStream<'a> {
    words: &'a str,
    spans: std::slice::Iter<'a, Span>,
    position: usize,
    current: Token,
}

impl Tokenizer for WordTokenizer {
    type TokenStream<'a> = WordStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> WordStream<'a> {
        self.words.clear();
        self.spans.clear();
        let (words, spans) = (&mut self.words, &mut self.spans);
        for_each_word(text, |offset, w| {
            let start = words.len();
            words.push_str(w);
            spans.push(Span {
                offset,
                start,
                end: words.len(),
            });
        });
        WordStream {
            words: &self.words,
            spans: self.spans.iter(),
            position: 0,
            current: Token::default(),
        }
    }
}

impl TokenStream for WordStream<'_> {
    fn advance(&mut self) -> bool {
        let Some(s) = self.spans.next() else {
            return false;
        };
        let t = &mut self.current;
        t.offset_from = s.offset;
        t.offset_to = s.offset + (s.end - s.start);
        t.position = self.position;
        t.position_length = 1;
        t.text.clear();
        t.text.push_str(&self.words[s.start..s.end]);
        self.position += 1;
        true
    }

    fn token(&self) -> &Token {
        &self.current
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.current
    }
}

/// Work the indexer thread is asked to do besides catching up.
#[derive(Default)]
pub(crate) struct Pending {
    /// Something was committed to the store (the writer rang).
    pub rung: bool,
    /// Serials the store no longer holds, found by searches.
    pub removals: Vec<u64>,
    pub stopping: bool,
    /// Threads waiting for the index to catch up (`Indexer::wait_caught_up`,
    /// a search finding it stale): while there are any, what is read is
    /// committed at once, not at the next commit interval.
    pub waiters: usize,
    /// Rings so far: writer commits the indexer may not have read yet.
    pub rings: u64,
    /// The rings whose events the index has committed (or read and found
    /// nothing to commit): below `rings`, the store holds events the index
    /// does not show yet.
    pub covered: u64,
    /// When the index last committed (`None`: not since the indexer started).
    pub committed_at: Option<std::time::Instant>,
    /// When a search last began (it keeps the indexer committing every
    /// `commit_interval_ms` for `idle_commit_interval_ms`).
    pub searched_at: Option<std::time::Instant>,
    /// The indexer thread runs: a search waits for it only then.
    pub running: bool,
    /// The indexer is catching up (a restart, a large sync): its next
    /// commit may be seconds away, so a search does not wait for it.
    pub behind: bool,
}

impl Pending {
    /// Whether the indexer's next commit is near: it runs and is not
    /// catching up (only then does a search wait for it).
    pub fn commit_near(&self) -> bool {
        self.running && !self.behind
    }
}

/// The full-text index: shared by the indexer thread (which writes it)
/// and the query workers (which search it).
pub struct SearchIndex {
    pub(crate) index: Index,
    pub(crate) reader: IndexReader,
    pub(crate) fields: Fields,
    pub(crate) cfg: SearchConfig,
    pub(crate) dir: PathBuf,
    pub(crate) pending: Mutex<Pending>,
    /// Wakes the indexer.
    pub(crate) wake: Condvar,
    /// Wakes the searches waiting for a commit (`crate::fresh`).
    pub(crate) fresh: Condvar,
}

impl SearchIndex {
    /// Opens the index in `dir` (created if missing). An index whose
    /// schema is not this build's is an error naming the directory
    /// (`sluice reindex` rebuilds it).
    pub fn open(dir: &Path, cfg: SearchConfig) -> Result<Arc<SearchIndex>, SearchError> {
        std::fs::create_dir_all(dir).map_err(|source| SearchError::Dir {
            path: dir.to_owned(),
            source,
        })?;
        let (schema, fields) = schema();
        let mmap = MmapDirectory::open(dir).map_err(|e| SearchError::Open {
            path: dir.to_owned(),
            message: e.to_string(),
        })?;
        let index = Index::open_or_create(mmap, schema).map_err(|e| SearchError::Open {
            path: dir.to_owned(),
            message: format!("{e} (rebuild it with `sluice reindex`)"),
        })?;
        index.tokenizers().register(WORDS, WordTokenizer::default());
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Arc::new(SearchIndex {
            index,
            reader,
            fields,
            cfg,
            dir: dir.to_owned(),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            fresh: Condvar::new(),
        }))
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &SearchConfig {
        &self.cfg
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// The writer committed events: the indexer reads them from the store.
    /// Coalescing: many rings before the indexer looks are one.
    pub fn ring(&self) {
        let mut p = self.lock();
        p.rings += 1;
        if !p.rung {
            p.rung = true;
            drop(p);
            self.wake.notify_one();
        }
    }

    /// The store no longer holds the event at `serial`: the indexer
    /// removes its document (bounded: when the queue is full the removal
    /// is dropped, counted, and found again by a later search).
    pub fn forget(&self, serial: u64) {
        let mut p = self.lock();
        if p.removals.len() >= MAX_PENDING_REMOVALS {
            drop(p);
            metrics::counter!(m::SEARCH_REMOVALS_DROPPED_TOTAL).increment(1);
            return;
        }
        p.removals.push(serial);
        drop(p);
        self.wake.notify_one();
    }

    /// The document of a stored event, when its kind is indexed (`None`
    /// too when its JSON is not an event's, which a stored event's is).
    pub(crate) fn document(&self, e: StoredRef<'_>) -> Option<TantivyDocument> {
        if !self.cfg.indexes(e.kind) {
            return None;
        }
        let TextParts { tags, content } = TextParts::parse(e.raw)?;
        let f = self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_u64(f.serial, e.serial);
        doc.add_u64(f.created_at, e.created_at);
        doc.add_u64(f.kind, u64::from(e.kind));
        doc.add_bytes(f.pubkey, &e.pubkey[..]);
        if let Some(lang) = language_of(&tags) {
            doc.add_text(f.language, &lang);
        }
        doc.add_text(
            f.text,
            text_of(e.kind, &tags, content, self.cfg.max_indexed_bytes_per_event),
        );
        Some(doc)
    }

    /// A searcher over the index as last committed, for an estimate (it
    /// never waits; a search about to run takes
    /// [`SearchIndex::fresh_searcher`]).
    pub fn searcher(&self) -> Searcher {
        self.reader.searcher()
    }

    /// Postings a search of `f` walks: the documents holding each word,
    /// summed (no store access).
    pub fn postings(&self, searcher: &Searcher, f: &Filter) -> u64 {
        let Some(s) = &f.search else { return 0 };
        s.words
            .iter()
            .map(|w| {
                searcher
                    .doc_freq(&Term::from_field_text(self.fields.text, w))
                    .unwrap_or(0)
            })
            .sum()
    }

    /// What a search of `f` costs in rows (the read path's cost unit):
    /// [`POSTINGS_PER_ROW`] postings walked count as one row read, and
    /// each word at least one.
    pub fn cost_rows(&self, searcher: &Searcher, f: &Filter) -> u64 {
        let words = f.search.as_ref().map_or(0, |s| s.words.len() as u64);
        (self.postings(searcher, f) / POSTINGS_PER_ROW).max(words)
    }

    /// The tantivy query for a filter: every word, the language, and the
    /// kinds, authors and time range (the other conditions are checked
    /// against the store).
    fn query(&self, f: &Filter) -> Box<dyn Query> {
        let fl = self.fields;
        let mut must: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        if let Some(s) = &f.search {
            for w in &s.words {
                must.push((
                    Occur::Must,
                    Box::new(TermQuery::new(
                        Term::from_field_text(fl.text, w),
                        IndexRecordOption::WithFreqs,
                    )),
                ));
            }
            if let Some(lang) = &s.language {
                must.push((
                    Occur::Must,
                    Box::new(TermQuery::new(
                        Term::from_field_text(fl.language, lang),
                        IndexRecordOption::Basic,
                    )),
                ));
            }
        }
        // Kinds that cover every indexed kind filter nothing here.
        let all_kinds = f
            .kinds
            .as_ref()
            .is_none_or(|k| self.cfg.kinds.iter().all(|i| k.binary_search(i).is_ok()));
        if let Some(kinds) = f.kinds.as_ref().filter(|_| !all_kinds) {
            let terms = kinds
                .iter()
                .map(|k| Term::from_field_u64(fl.kind, u64::from(*k)));
            must.push((Occur::Must, Box::new(TermSetQuery::new(terms))));
        }
        if let Some(authors) = &f.authors {
            let terms = authors.iter().map(|a| Term::from_field_bytes(fl.pubkey, a));
            must.push((Occur::Must, Box::new(TermSetQuery::new(terms))));
        }
        if f.since.is_some() || f.until.is_some() {
            let bound = |v: Option<u64>| match v {
                Some(v) => Bound::Included(Term::from_field_u64(fl.created_at, v)),
                None => Bound::Unbounded,
            };
            must.push((
                Occur::Must,
                Box::new(RangeQuery::new(bound(f.since), bound(f.until))),
            ));
        }
        match must.len() {
            0 => Box::new(AllQuery),
            // Alone, a word's query ranks with block-max pruning.
            1 => must.remove(0).1,
            _ => Box::new(BooleanQuery::new(must)),
        }
    }

    /// The `n` best hits of `f`'s search in `searcher` (ranked below
    /// `after` when given: the next page), by relevance, then created_at
    /// (newest first), then serial: exactly, with the scorer's block-max
    /// pruning (`rank.rs`).
    pub fn search(
        &self,
        searcher: &Searcher,
        f: &Filter,
        after: Option<RankedHit>,
        n: usize,
    ) -> Result<Vec<RankedHit>, SearchError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let query = self.query(f);
        Ok(Ranked { k: n, after }.best(searcher, &*query)?)
    }

    /// A hit's created_at and serial, from the fast fields.
    fn hit(
        &self,
        searcher: &Searcher,
        score: f32,
        addr: DocAddress,
    ) -> Result<RankedHit, SearchError> {
        let fast = searcher.segment_reader(addr.segment_ord).fast_fields();
        let created_at = fast.u64("created_at")?.first(addr.doc_id).unwrap_or(0);
        let serial = fast.u64("serial")?.first(addr.doc_id).unwrap_or(0);
        Ok(RankedHit {
            score,
            created_at,
            serial,
        })
    }

    /// The serials of the documents `f`'s search matches (a COUNT's),
    /// sorted, at most `max` of them (the lowest), and whether there were
    /// more.
    pub fn matching_serials(
        &self,
        searcher: &Searcher,
        f: &Filter,
        max: u64,
    ) -> Result<(Vec<u64>, bool), SearchError> {
        let query = self.query(f);
        let docs = searcher.search(&*query, &tantivy::collector::DocSetCollector)?;
        let mut serials = Vec::with_capacity(docs.len());
        for addr in docs {
            serials.push(self.hit(searcher, 0.0, addr)?.serial);
        }
        serials.sort_unstable();
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let more = serials.len() > max;
        serials.truncate(max);
        Ok((serials, more))
    }

    /// Bytes the index takes on disk.
    pub fn disk_bytes(&self) -> u64 {
        dir_bytes(&self.dir)
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
