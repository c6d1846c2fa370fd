//! The web of trust and proof of work as the relay runs them (`[trust]`,
//! `[pow]`; the decisions are `sluice_throttle::trust` and
//! `sluice_throttle::admission`).
//!
//! One thread (`sluice-trust`) owns the [`TrustGraph`]: at start it reads
//! from the store the follow list (kind 3) of every pubkey that counts,
//! nearest first, and whenever the writer stores a kind 3 of such a pubkey
//! it takes that list, walks the graph again and reads the lists it newly
//! needs. What it publishes is one snapshot of distances (`ArcSwap`), read
//! per EVENT without a lock. The store is where the graph survives a
//! restart: it is rebuilt from the lists the store holds.
//!
//! Bounded: the graph tracks at most `trust.max_pubkeys`, keeps at most
//! `trust.max_follows_per_list` of a list, and the writer hands lists over
//! through a queue of [`FEED_CAPACITY`]; when that is full the list is not
//! lost: the thread rebuilds from the store
//! (`sluice_trust_feed_overflows_total`).
//!
//! The adaptive difficulty is ticked by the monitor ([`Trust::tick`]) from
//! the write controller's output and the outsiders' demand on their budget.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice_proto::{Event, Filter};
use sluice_store::{QueryOptions, Store};
use sluice_throttle::pow::required;
use sluice_throttle::trust::{OutsiderRule, WriteStanding};
use sluice_throttle::{
    Explanation, PowConfig, PowController, Tiers, TiersConfig, TrustConfig, TrustGraph,
};

use crate::clock::unix_now;
use crate::metrics_names as m;

/// Lists the writer may hand over before the trust thread takes them.
pub const FEED_CAPACITY: usize = 1024;

/// Authors whose lists one store query reads.
const LISTS_PER_QUERY: usize = 256;

/// `[trust]` and `[pow]` as in force, with the tier index of each distance.
#[derive(Debug, Clone, Default)]
pub struct TrustSettings {
    pub trust: TrustConfig,
    pub pow: PowConfig,
    /// Tier index (see `sluice_throttle::Tiers`) of distances 0..=4.
    tier_of_distance: [Option<u8>; 5],
}

impl TrustSettings {
    /// From validated sections; `tiers` is `[throttle.tiers]`.
    pub fn new(trust: TrustConfig, pow: PowConfig, tiers: &TiersConfig) -> TrustSettings {
        let all = Tiers::new(tiers);
        let mut tier_of_distance = [None; 5];
        for (d, slot) in tier_of_distance.iter_mut().enumerate() {
            *slot = trust
                .distance_tiers
                .name(d as u8)
                .and_then(|name| all.all().iter().find(|t| t.name == name))
                .map(|t| t.index);
        }
        TrustSettings {
            trust,
            pow,
            tier_of_distance,
        }
    }
}

enum Feed {
    /// A stored kind 3 of a pubkey that counts.
    List {
        author: [u8; 32],
        created_at: u64,
        follows: Vec<[u8; 32]>,
    },
}

/// `[trust]` and `[pow]` as [`Trust::prepare`] left them, for
/// [`Trust::commit`].
pub struct PreparedTrust {
    settings: TrustSettings,
    web: Web,
}

impl PreparedTrust {
    /// The sections as they will apply.
    pub fn settings(&self) -> &TrustSettings {
        &self.settings
    }
}

/// What a commit does to the web's thread.
enum Web {
    /// `[trust]` is unchanged: the thread (and its web) stays.
    Keep,
    /// No web: the thread stops and no pubkey is in it.
    Off,
    /// A new thread, started, waiting for its generation.
    Start(Started),
}

/// A `sluice-trust` thread that has not read anything yet.
struct Started {
    /// Where its generation is sent once committed (dropped: it ends).
    go: SyncSender<u64>,
    feed: SyncSender<Feed>,
    thread: JoinHandle<()>,
}

/// The relay's web of trust and proof-of-work state.
pub struct Trust {
    settings: ArcSwap<TrustSettings>,
    /// Distances of the pubkeys in the web (empty without seeds).
    distances: ArcSwap<HashMap<[u8; 32], u8>>,
    /// Adaptive bits on top of the `[pow]` floors.
    pow_extra: AtomicU32,
    controller: Mutex<PowController>,
    feed: Mutex<Option<SyncSender<Feed>>>,
    /// The writer found the feed full: the thread rebuilds from the store.
    overflowed: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Whether the first build from the store is done.
    ready: Arc<AtomicBool>,
    /// Which thread may publish: a thread of an older `[trust]` still
    /// finishing its walk publishes nothing.
    generation: AtomicU64,
}

impl Default for Trust {
    fn default() -> Self {
        Trust {
            settings: ArcSwap::from_pointee(TrustSettings::default()),
            distances: ArcSwap::from_pointee(HashMap::new()),
            pow_extra: AtomicU32::new(0),
            controller: Mutex::new(PowController::new()),
            feed: Mutex::new(None),
            overflowed: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            ready: Arc::new(AtomicBool::new(false)),
            generation: AtomicU64::new(0),
        }
    }
}

impl Trust {
    /// The sections in force.
    pub fn settings(&self) -> Arc<TrustSettings> {
        self.settings.load_full()
    }

    /// What an EVENT of `kind` by `author` meets (its signature unchecked
    /// yet, or checked).
    pub fn standing(&self, author: &[u8; 32], kind: u16) -> WriteStanding {
        let s = self.settings.load();
        if let Some(&distance) = self.distances.load().get(author) {
            return WriteStanding::Trusted {
                distance,
                tier: s.tier_of_distance[usize::from(distance.min(4))],
            };
        }
        let floor = s.pow.floor(kind);
        WriteStanding::Outsider(OutsiderRule {
            writes: s.trust.outsider_writes,
            floor,
            current: required(&s.pow, kind, self.pow_extra.load(Ordering::Relaxed)),
            adaptive: s.pow.adaptive,
        })
    }

    /// The tier a pubkey's distance in the web gives it, if any (an
    /// authenticated connection's read tier, NIP-42).
    pub fn tier_of(&self, pubkey: &[u8; 32]) -> Option<u8> {
        let d = *self.distances.load().get(pubkey)?;
        self.settings.load().tier_of_distance[usize::from(d.min(4))]
    }

    /// The difficulty an outsider's note must carry now (NIP-11
    /// `limitation.min_pow_difficulty`).
    pub fn difficulty_now(&self) -> u32 {
        let s = self.settings.load();
        required(&s.pow, 1, self.pow_extra.load(Ordering::Relaxed))
    }

    /// One monitor tick: the adaptive difficulty from the write
    /// controller's output and the outsiders' demand over `tick` (`asks`:
    /// their EVENTs that asked for the shared budget since the last tick).
    pub(crate) fn tick(&self, write_output: f64, asks: u64, tick: Duration, now_ns: u64) {
        let s = self.settings.load();
        let asks = asks as f64;
        let allowed = s.trust.outsider_events_per_s * tick.as_secs_f64();
        let demand = if allowed > 0.0 { asks / allowed } else { 0.0 };
        let extra = self
            .controller
            .lock()
            .tick(&s.pow, write_output, demand, now_ns);
        self.pow_extra.store(extra, Ordering::Relaxed);
        metrics::gauge!(m::POW_DIFFICULTY).set(f64::from(required(&s.pow, 1, extra)));
    }

    /// The stored events of a batch, from the writer: a kind 3 of a pubkey
    /// whose list counts goes to the trust thread.
    pub(crate) fn note_stored<'a>(&self, events: impl IntoIterator<Item = &'a Event>) {
        let feed = self.feed.lock();
        let Some(tx) = feed.as_ref() else { return };
        let max_distance = self.settings.load().trust.max_distance;
        let distances = self.distances.load();
        for ev in events {
            if ev.kind != 3 || distances.get(&ev.pubkey).is_none_or(|d| *d >= max_distance) {
                continue;
            }
            let msg = Feed::List {
                author: ev.pubkey,
                created_at: ev.created_at,
                follows: follows_of(ev, usize::MAX),
            };
            match tx.try_send(msg) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    metrics::counter!(m::TRUST_FEED_OVERFLOWS_TOTAL).increment(1);
                    self.overflowed.store(true, Ordering::Release);
                }
                Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }

    /// Prepares `[trust]` and `[pow]` (at start and at a reload), changing
    /// nothing: when `[trust]` changed (or no thread runs) and a web is
    /// configured, the new `sluice-trust` thread is started here, waiting
    /// for [`Trust::commit`] before it reads anything, so the one error
    /// (the system will not start it) comes before any setting changed.
    /// Dropped instead, the prepared thread ends without reading.
    pub(crate) fn prepare(
        self: &Arc<Self>,
        settings: TrustSettings,
        store: &Store,
    ) -> Result<PreparedTrust, crate::StartError> {
        let restart = self.settings.load().trust != settings.trust || self.thread.lock().is_none();
        let web = if !restart {
            Web::Keep
        } else if !settings.trust.enabled() {
            Web::Off
        } else {
            Web::Start(self.spawn(&settings.trust, store)?)
        };
        Ok(PreparedTrust { settings, web })
    }

    /// Applies what [`Trust::prepare`] prepared; cannot fail. A thread of
    /// the old `[trust]` ends by itself once its feed is gone, and
    /// publishes nothing more: a reload does not wait for its walk, and the
    /// old distances serve until the new walk publishes.
    pub(crate) fn commit(&self, prepared: PreparedTrust) {
        self.settings.store(Arc::new(prepared.settings));
        let start = match prepared.web {
            Web::Keep => return,
            Web::Off => None,
            Web::Start(started) => Some(started),
        };
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        drop(self.feed.lock().take());
        drop(self.thread.lock().take());
        let Some(started) = start else {
            self.distances.store(Arc::new(HashMap::new()));
            self.ready.store(true, Ordering::Release);
            return;
        };
        self.ready.store(false, Ordering::Release);
        *self.feed.lock() = Some(started.feed);
        *self.thread.lock() = Some(started.thread);
        // A channel of one, just made, that the waiting thread holds: the
        // send neither waits nor fails.
        let _ = started.go.try_send(generation);
    }

    /// Starts a `sluice-trust` thread for `cfg` that waits for its
    /// generation (from [`Trust::commit`]) before it reads the store, and
    /// ends if it is dropped instead.
    fn spawn(
        self: &Arc<Self>,
        cfg: &TrustConfig,
        store: &Store,
    ) -> Result<Started, crate::StartError> {
        let (go, go_rx) = sync_channel::<u64>(1);
        let (tx, rx) = sync_channel::<Feed>(FEED_CAPACITY);
        let me = Arc::downgrade(self);
        let store = store.clone();
        let overflowed = self.overflowed.clone();
        let ready = self.ready.clone();
        let cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-trust".into())
            .spawn(move || {
                // Prepared but not applied: nothing to read.
                let Ok(generation) = go_rx.recv() else { return };
                let mut graph = TrustGraph::new(&cfg);
                let publish = |graph: &TrustGraph| {
                    let Some(t) = me.upgrade() else { return false };
                    if t.generation.load(Ordering::Acquire) != generation {
                        return false;
                    }
                    t.distances.store(Arc::new(graph.distances()));
                    metrics::gauge!(m::TRUST_PUBKEYS).set(graph.len() as f64);
                    metrics::gauge!(m::TRUST_TRUNCATED).set(f64::from(u8::from(graph.truncated())));
                    metrics::counter!(m::TRUST_RECOMPUTES_TOTAL).increment(1);
                    true
                };
                read_missing(&store, &mut graph, cfg.max_follows_per_list);
                if !publish(&graph) {
                    return;
                }
                ready.store(true, Ordering::Release);
                tracing::info!(
                    pubkeys = graph.len(),
                    truncated = graph.truncated(),
                    "web of trust read from the store"
                );
                loop {
                    match rx.recv_timeout(Duration::from_millis(500)) {
                        Ok(Feed::List {
                            author,
                            created_at,
                            follows,
                        }) => {
                            let mut changed = graph.offer(author, created_at, &follows);
                            // Whatever else is waiting, in one walk.
                            while let Ok(Feed::List {
                                author,
                                created_at,
                                follows,
                            }) = rx.try_recv()
                            {
                                changed |= graph.offer(author, created_at, &follows);
                            }
                            if changed {
                                graph.recompute();
                                read_missing(&store, &mut graph, cfg.max_follows_per_list);
                                if !publish(&graph) {
                                    return;
                                }
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    if overflowed.swap(false, Ordering::AcqRel) {
                        graph = TrustGraph::new(&cfg);
                        read_missing(&store, &mut graph, cfg.max_follows_per_list);
                        if !publish(&graph) {
                            return;
                        }
                    }
                }
            })
            .map_err(|source| crate::StartError::Thread {
                thread: "sluice-trust".into(),
                source,
            })?;
        Ok(Started {
            go,
            feed: tx,
            thread,
        })
    }

    /// Whether the first build from the store is done (always, without a
    /// web).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Waits up to `limit` for the first build; whether it is done.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while !self.ready() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Stops the thread and waits for it (shutdown).
    pub(crate) fn stop(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop(self.feed.lock().take());
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Why `pubkey` is or is not trusted, by a graph built from the store
    /// now (`sluice trust explain`).
    pub fn explain(
        cfg: &TrustConfig,
        store: &Store,
        pubkey: &[u8; 32],
    ) -> (Explanation, TrustGraph) {
        let mut graph = TrustGraph::new(cfg);
        read_missing(store, &mut graph, cfg.max_follows_per_list);
        (graph.explain(pubkey), graph)
    }
}

/// The `p` tags of a kind 3, at most `max`.
fn follows_of(ev: &Event, max: usize) -> Vec<[u8; 32]> {
    ev.tags
        .iter()
        .filter(|t| t.len() >= 2 && t[0] == "p")
        .filter_map(|t| sluice_proto::hex32::decode::<32>(&t[1]))
        .take(max)
        .collect()
}

/// Reads from the store the lists the graph needs, until it needs none:
/// each walk may reach pubkeys whose lists count in turn. A store error is
/// logged and leaves those lists unread (the next change reads them).
fn read_missing(store: &Store, graph: &mut TrustGraph, max_follows: usize) {
    loop {
        let missing = graph.missing_lists();
        if missing.is_empty() {
            return;
        }
        for chunk in missing.chunks(LISTS_PER_QUERY) {
            let filter = Filter {
                authors: Some(chunk.to_vec()),
                kinds: Some(vec![3]),
                ..Filter::default()
            };
            let opts = QueryOptions {
                now: unix_now(),
                max_scan_rows: (chunk.len() as u64).saturating_mul(4).max(64),
            };
            let found = match store.query(&[filter], &opts) {
                Ok(out) => out.events,
                Err(e) => {
                    tracing::error!(error = %e, "trust: reading follow lists failed");
                    return;
                }
            };
            for raw in found {
                if let Ok(ev) = Event::parse(&raw) {
                    graph.offer(ev.pubkey, ev.created_at, &follows_of(&ev, max_follows));
                }
            }
            for author in chunk {
                graph.no_list(*author);
            }
        }
        graph.recompute();
    }
}

#[cfg(test)]
mod tests {
    use sluice_proto::Event;
    use sluice_store::{Store, StoreOptions};
    use sluice_throttle::trust::WriteStanding;
    use sluice_throttle::{PowConfig, ThrottleConfig, TiersConfig, TrustConfig};

    use crate::Engine;
    use crate::config::EngineConfig;
    use crate::tests::wait_until;

    fn pubkey(sk: u8) -> [u8; 32] {
        Event::sign(&[sk; 32], 1, 1, vec![], "").pubkey
    }

    fn web(seed: u8) -> TrustConfig {
        TrustConfig {
            seed_pubkeys: vec![sluice_proto::hex32::encode(&pubkey(seed))],
            ..TrustConfig::default()
        }
    }

    fn distance(engine: &Engine, sk: u8) -> Option<u8> {
        match engine.trust().standing(&pubkey(sk), 1) {
            WriteStanding::Trusted { distance, .. } => Some(distance),
            WriteStanding::Outsider(_) => None,
        }
    }

    /// A reload prepares the new web (its thread started) before anything
    /// changes: dropped unapplied (another part refused), nothing changed
    /// and that thread never publishes; committed, even well after it was
    /// prepared, the thread reads the store and publishes.
    #[test]
    fn a_prepared_web_changes_nothing_until_committed() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            map_size_bytes: 64 << 20,
            max_readers: 126,
            write_map: false,
            write_map_when_alone: false,
            min_free_disk_bytes: 0,
        };
        let store = Store::open(dir.path(), &opts).unwrap();
        let engine =
            Engine::start(store, EngineConfig::default(), ThrottleConfig::default()).unwrap();
        let tiers = TiersConfig::default();
        // Key 1 follows key 2.
        let list = Event::sign(
            &[1; 32],
            1,
            3,
            vec![vec!["p".into(), sluice_proto::hex32::encode(&pubkey(2))]],
            "",
        );
        engine.write_batch_blocking(vec![list]).unwrap();
        assert!(engine.trust().settings().trust.seed_pubkeys.is_empty());

        let dropped = engine
            .prepare_trust(web(1), PowConfig::default(), &tiers)
            .unwrap();
        assert!(engine.trust().settings().trust.seed_pubkeys.is_empty());
        drop(dropped);
        // A web that follows nobody, applied: key 2 stays an outsider
        // (the dropped web, which would have trusted it, never publishes).
        let other = engine
            .prepare_trust(web(3), PowConfig::default(), &tiers)
            .unwrap();
        engine.commit_trust(other);
        wait_until("the web of key 3 is read", || engine.trust().ready());
        assert_eq!(distance(&engine, 3), Some(0));
        assert_eq!(distance(&engine, 2), None);

        let prepared = engine
            .prepare_trust(web(1), PowConfig::default(), &tiers)
            .unwrap();
        assert_eq!(distance(&engine, 3), Some(0), "the old web serves");
        engine.commit_trust(prepared);
        wait_until("key 2 is trusted", || distance(&engine, 2) == Some(1));
        assert_eq!(distance(&engine, 1), Some(0));
        assert_eq!(distance(&engine, 3), None);
        engine.shutdown();
    }
}
