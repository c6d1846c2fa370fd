//! `query`: a REQ mix against a relay already filled from a JSONL file.
//!
//! The queries are derived from the same file (authors, kinds, referenced
//! event ids, mentioned pubkeys, hashtags, time range) so they hit stored
//! events. Each connection runs closed loop: REQ, read to EOSE (or CLOSED),
//! CLOSE, next. Reports queries/s and time-to-EOSE percentiles per query type.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{Value, json};
use sluice_proto::Event;

use crate::report::RunInfo;
use crate::rng::Rng;
use crate::stats::{Examples, Histogram, LatencySummary, PrefixCounts, per_sec};
use crate::wire::{self, Incoming, RelayUrl, Ws};
use tokio_tungstenite::tungstenite::Message;

/// Most distinct values kept per field when deriving queries.
const MAX_VALUES_PER_FIELD: usize = 100_000;

#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// Relay URL (ws://host:port).
    pub relay: String,
    /// The JSONL file the relay was filled from; queries are derived from it.
    #[arg(long)]
    pub events: PathBuf,
    /// Read at most this many events from the file to derive queries.
    #[arg(long, default_value_t = 200_000)]
    pub max_events: usize,
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Run for this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Stop after this many queries in all (whichever comes first).
    #[arg(long)]
    pub queries: Option<u64>,
    /// The `limit` of every filter.
    #[arg(long, default_value_t = 50)]
    pub limit: u64,
    /// Weights of the query types.
    #[arg(
        long,
        default_value = "author=30,author_kinds=25,e=15,p=10,t=10,kinds_since=10"
    )]
    pub mix: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A query without EOSE after this long counts as a timeout.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The query types of the mix.
pub const QUERY_TYPES: [&str; 7] = [
    "author",
    "author_kinds",
    "e",
    "p",
    "t",
    "kinds_since",
    "search",
];

/// Values seen in the file, for building queries that hit.
#[derive(Debug, Default)]
pub struct QueryPool {
    authors: Vec<String>,
    author_kinds: Vec<(String, u16)>,
    e_targets: Vec<String>,
    p_values: Vec<String>,
    t_values: Vec<String>,
    kinds: Vec<u16>,
    /// Words of kind-1 contents (NIP-50 `search`), each held by an event,
    /// as often as the notes use them.
    words: Vec<String>,
    min_created_at: u64,
    max_created_at: u64,
}

#[derive(Default)]
struct PoolSets {
    authors: BTreeSet<String>,
    author_kinds: BTreeSet<(String, u16)>,
    e: BTreeSet<String>,
    p: BTreeSet<String>,
    t: BTreeSet<String>,
    kinds: BTreeSet<u16>,
    /// One word of each note (repeats kept: drawn as often as used).
    words: Vec<String>,
}

fn insert_bounded<T: Ord>(set: &mut BTreeSet<T>, v: T) {
    if set.len() < MAX_VALUES_PER_FIELD {
        set.insert(v);
    }
}

impl QueryPool {
    pub fn from_file(path: &Path, max_events: usize) -> anyhow::Result<QueryPool> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let (mut sets, mut min, mut max) = (PoolSets::default(), u64::MAX, 0);
        let lines = std::io::BufReader::new(file).lines().map_while(Result::ok);
        for line in lines.take(max_events) {
            let Ok(ev) = Event::parse(line.trim()) else {
                continue;
            };
            min = min.min(ev.created_at);
            max = max.max(ev.created_at);
            sets.add(&ev);
        }
        if sets.authors.is_empty() {
            bail!("no events in {}", path.display());
        }
        Ok(QueryPool {
            authors: sets.authors.into_iter().collect(),
            author_kinds: sets.author_kinds.into_iter().collect(),
            e_targets: sets.e.into_iter().collect(),
            p_values: sets.p.into_iter().collect(),
            t_values: sets.t.into_iter().collect(),
            kinds: sets.kinds.into_iter().collect(),
            words: sets.words,
            min_created_at: min,
            max_created_at: max,
        })
    }

    /// A filter of the given type, or `None` when the file has no values for it.
    pub fn filter(&self, kind: &str, limit: u64, rng: &mut Rng) -> Option<Value> {
        fn pick<'a, T>(v: &'a [T], rng: &mut Rng) -> Option<&'a T> {
            (!v.is_empty()).then(|| &v[rng.below(v.len() as u64) as usize])
        }
        Some(match kind {
            "author" => json!({"authors": [pick(&self.authors, rng)?], "limit": limit}),
            "author_kinds" => {
                let (a, k) = pick(&self.author_kinds, rng)?;
                json!({"authors": [a], "kinds": [k], "limit": limit})
            }
            "e" => json!({"#e": [pick(&self.e_targets, rng)?], "limit": limit}),
            "p" => json!({"#p": [pick(&self.p_values, rng)?], "limit": limit}),
            "t" => json!({"#t": [pick(&self.t_values, rng)?], "limit": limit}),
            "kinds_since" => {
                let span = self.max_created_at.saturating_sub(self.min_created_at);
                let since = self.min_created_at + span / 2 + rng.below(span / 2 + 1);
                json!({"kinds": [pick(&self.kinds, rng)?], "since": since, "limit": limit})
            }
            // One word of a stored note: it has at least that event.
            "search" => json!({"search": pick(&self.words, rng)?, "limit": limit}),
            _ => return None,
        })
    }
}

impl PoolSets {
    fn add(&mut self, ev: &Event) {
        let author = hex::encode(ev.pubkey);
        insert_bounded(&mut self.author_kinds, (author.clone(), ev.kind));
        insert_bounded(&mut self.authors, author);
        insert_bounded(&mut self.kinds, ev.kind);
        if ev.kind == 1 && self.words.len() < MAX_VALUES_PER_FIELD {
            // One word per note, at a place its id picks: words come as
            // often as notes use them (common words often, rare ones
            // rarely), each held by a stored event.
            let words: Vec<String> = sluice_proto::search::words(&ev.content)
                .map(|(_, w)| w)
                .filter(|w| w.len() >= 3)
                .collect();
            if !words.is_empty() {
                let at = usize::from(ev.id[0]) % words.len();
                self.words.push(words[at].clone());
            }
        }
        for t in ev.tags.iter().filter(|t| t.len() >= 2) {
            let set = match t[0].as_str() {
                "e" => &mut self.e,
                "p" => &mut self.p,
                "t" => &mut self.t,
                _ => continue,
            };
            insert_bounded(set, t[1].clone());
        }
    }
}

/// Parses `name=weight,...` into weights aligned with `QUERY_TYPES`.
pub fn parse_mix(mix: &str) -> anyhow::Result<Vec<u32>> {
    let mut weights = vec![0u32; QUERY_TYPES.len()];
    for part in mix.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, w) = part
            .split_once('=')
            .with_context(|| format!("bad mix entry {part:?}"))?;
        let i = QUERY_TYPES
            .iter()
            .position(|t| *t == name.trim())
            .with_context(|| format!("unknown query type {name:?}; known: {QUERY_TYPES:?}"))?;
        weights[i] = w
            .trim()
            .parse()
            .with_context(|| format!("bad weight in {part:?}"))?;
    }
    if weights.iter().all(|w| *w == 0) {
        bail!("the query mix has no positive weight");
    }
    Ok(weights)
}

/// Results for one query type.
#[derive(Debug, Clone, Default)]
struct TypeTally {
    queries: u64,
    events: u64,
    empty: u64,
    closed: u64,
    timeouts: u64,
    eose_latency: Histogram,
    closed_prefixes: PrefixCounts,
    examples: Examples,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TypeReport {
    /// Queries answered with EOSE.
    pub queries: u64,
    pub queries_per_sec: f64,
    pub events_returned: u64,
    pub mean_events_per_query: f64,
    /// Queries answered with EOSE and no event.
    pub empty: u64,
    pub closed: u64,
    pub timeouts: u64,
    pub time_to_eose: LatencySummary,
    pub closed_prefixes: PrefixCounts,
    pub closed_examples: Examples,
}

impl TypeTally {
    fn merge(&mut self, o: &TypeTally) {
        self.queries += o.queries;
        self.events += o.events;
        self.empty += o.empty;
        self.closed += o.closed;
        self.timeouts += o.timeouts;
        self.eose_latency.merge(&o.eose_latency);
        self.closed_prefixes.merge(&o.closed_prefixes);
        self.examples.merge(&o.examples);
    }

    fn report(&self, secs: f64) -> TypeReport {
        TypeReport {
            queries: self.queries,
            queries_per_sec: per_sec(self.queries, secs),
            events_returned: self.events,
            mean_events_per_query: self.events as f64 / self.queries.max(1) as f64,
            empty: self.empty,
            closed: self.closed,
            timeouts: self.timeouts,
            time_to_eose: self.eose_latency.summary(),
            closed_prefixes: self.closed_prefixes.clone(),
            closed_examples: self.examples.clone(),
        }
    }
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct QueryReport {
    pub run: RunInfo,
    pub connections: usize,
    pub limit: u64,
    pub mix: String,
    pub elapsed_secs: f64,
    pub connection_errors: u64,
    pub total: TypeReport,
    pub by_type: BTreeMap<String, TypeReport>,
}

struct Shared {
    pool: QueryPool,
    weights: Vec<u32>,
    limit: u64,
    timeout: Duration,
    stop_at: Instant,
    budget: Option<u64>,
    issued: std::sync::atomic::AtomicU64,
    tallies: Mutex<Vec<TypeTally>>,
    connection_errors: std::sync::atomic::AtomicU64,
}

pub async fn run(args: &QueryArgs) -> anyhow::Result<QueryReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let run = RunInfo::new("query", Some(&args.relay));
    let shared = Arc::new(Shared {
        pool: QueryPool::from_file(&args.events, args.max_events)?,
        weights: parse_mix(&args.mix)?,
        limit: args.limit,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at: Instant::now() + Duration::from_secs_f64(args.duration_secs),
        budget: args.queries,
        issued: 0.into(),
        tallies: Mutex::new(vec![TypeTally::default(); QUERY_TYPES.len()]),
        connection_errors: 0.into(),
    });
    let started = Instant::now();
    let mut seeds = Rng::new(args.seed);
    let tasks: Vec<_> = (0..args.connections.max(1))
        .map(|i| {
            tokio::spawn(query_connection(
                relay.clone(),
                shared.clone(),
                seeds.fork(i as u64),
            ))
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(build_report(args, run, &shared, elapsed))
}

fn build_report(args: &QueryArgs, mut run: RunInfo, shared: &Shared, elapsed: f64) -> QueryReport {
    run.finish();
    let tallies = shared.tallies.lock().expect("tallies lock");
    let mut total = TypeTally::default();
    let mut by_type = BTreeMap::new();
    for (name, t) in QUERY_TYPES.iter().zip(tallies.iter()) {
        total.merge(t);
        if t.queries + t.closed + t.timeouts > 0 {
            by_type.insert((*name).to_owned(), t.report(elapsed));
        }
    }
    QueryReport {
        run,
        connections: args.connections,
        limit: args.limit,
        mix: args.mix.clone(),
        elapsed_secs: elapsed,
        connection_errors: shared
            .connection_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        total: total.report(elapsed),
        by_type,
    }
}

impl Shared {
    /// Takes one query from the budget; false when the run is over.
    fn take(&self) -> bool {
        if Instant::now() >= self.stop_at {
            return false;
        }
        let n = self
            .issued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.budget.is_none_or(|b| n < b)
    }
}

async fn query_connection(relay: RelayUrl, shared: Arc<Shared>, mut rng: Rng) {
    while Instant::now() < shared.stop_at {
        let Ok(mut ws) = wire::connect(&relay, None).await else {
            shared
                .connection_errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        match query_loop(&mut ws, &shared, &mut rng).await {
            Ok(()) => {
                let _ = ws.close(None).await;
                return;
            }
            Err(_) => {
                shared
                    .connection_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// Runs queries until the time or the budget is up. The connection's tallies
/// are its own until it ends (a histogram per query would cost the client
/// more than many a query costs the relay), then merged into the run's,
/// whether it ended well or not.
async fn query_loop(ws: &mut Ws, shared: &Shared, rng: &mut Rng) -> anyhow::Result<()> {
    let mut tallies = vec![TypeTally::default(); QUERY_TYPES.len()];
    let result = query_until_done(ws, shared, rng, &mut tallies).await;
    let mut all = shared.tallies.lock().expect("tallies lock");
    for (sum, t) in all.iter_mut().zip(&tallies) {
        sum.merge(t);
    }
    result
}

async fn query_until_done(
    ws: &mut Ws,
    shared: &Shared,
    rng: &mut Rng,
    tallies: &mut [TypeTally],
) -> anyhow::Result<()> {
    let mut n = 0u64;
    while shared.take() {
        let ty = rng.weighted(&shared.weights);
        let Some(filter) = shared.pool.filter(QUERY_TYPES[ty], shared.limit, rng) else {
            continue;
        };
        n += 1;
        let sub = format!("q{n}");
        one_query(ws, &sub, &filter, shared.timeout, &mut tallies[ty]).await?;
    }
    Ok(())
}

/// Sends one REQ and reads until its EOSE or CLOSED, then CLOSEs it.
async fn one_query(
    ws: &mut Ws,
    sub: &str,
    filter: &Value,
    timeout: Duration,
    t: &mut TypeTally,
) -> anyhow::Result<()> {
    let started = Instant::now();
    ws.send(wire::req(sub, filter)).await?;
    let mut events = 0u64;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        let msg = tokio::select! {
            m = ws.next() => m.context("connection closed")??,
            _ = &mut deadline => { t.timeouts += 1; break; }
        };
        if let Message::Text(text) = &msg
            && Incoming::event_sub(text.as_str()) == Some(sub)
        {
            events += 1;
            continue;
        }
        match Incoming::from_message(&msg) {
            Some(Incoming::Event { sub: s, .. }) if s == sub => events += 1,
            Some(Incoming::Eose { sub: s }) if s == sub => {
                t.queries += 1;
                t.events += events;
                t.empty += u64::from(events == 0);
                t.eose_latency.record(started.elapsed().as_micros() as u64);
                break;
            }
            Some(Incoming::Closed { sub: s, message }) if s == sub => {
                t.closed += 1;
                t.closed_prefixes.add(&message);
                t.examples.add(&message);
                return Ok(()); // no CLOSE needed for a closed subscription
            }
            _ => {}
        }
    }
    ws.send(wire::close(sub)).await?;
    Ok(())
}

impl QueryReport {
    pub fn print(&self) {
        println!(
            "query: {} {} connections, limit {}, {:.2} s, connection errors {}",
            self.run.relay.as_deref().unwrap_or("?"),
            self.connections,
            self.limit,
            self.elapsed_secs,
            self.connection_errors
        );
        println!("  {}", self.run.cpu_line());
        print_type("all", &self.total);
        for (name, r) in &self.by_type {
            print_type(name, r);
        }
    }
}

fn print_type(name: &str, r: &TypeReport) {
    println!(
        "  {name:<13} {:>8} queries {:>9.0}/s  {:>6.1} events/query  {} empty  {} closed  {} timeouts",
        r.queries, r.queries_per_sec, r.mean_events_per_query, r.empty, r.closed, r.timeouts
    );
    println!("  {:<13} time to EOSE: {}", "", r.time_to_eose);
    if r.closed > 0 {
        println!("  {:<13} closed by prefix: {}", "", r.closed_prefixes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_and_rejects_unknown_types() {
        let w = parse_mix("author=3,t=1").unwrap();
        assert_eq!(w, vec![3, 0, 0, 0, 1, 0, 0]);
        assert!(parse_mix("nope=1").is_err());
        assert!(parse_mix("author=0").is_err());
    }

    #[test]
    fn filters_come_from_the_pool() {
        let pool = QueryPool {
            authors: vec!["a".repeat(64)],
            author_kinds: vec![("a".repeat(64), 1)],
            kinds: vec![1],
            min_created_at: 100,
            max_created_at: 200,
            ..QueryPool::default()
        };
        let mut rng = Rng::new(1);
        let f = pool.filter("author_kinds", 10, &mut rng).unwrap();
        assert_eq!(
            f,
            json!({"authors": ["a".repeat(64)], "kinds": [1], "limit": 10})
        );
        let since = pool.filter("kinds_since", 10, &mut rng).unwrap()["since"]
            .as_u64()
            .unwrap();
        assert!((150..=200).contains(&since));
        assert!(pool.filter("e", 10, &mut rng).is_none());
    }
}
