//! Cluster mode: several Sluice nodes behind a load balancer share one
//! Redis server (`[cluster]`, off by default).
//!
//! - **Live events** (`stream.rs`): every event a client stores on a node,
//!   and every ephemeral event, leaves through the engine's replication tap
//!   to one Redis stream (`<prefix>:events`, trimmed with `MAXLEN ~`). Each
//!   node reads the stream in its own consumer group (named by its node
//!   id, so Redis remembers each node's position), stores what it lacks
//!   through its own writer (same write rules; never re-published) and
//!   delivers it to its live subscribers; an entry is acknowledged after
//!   the commit, so a node killed at any moment re-reads what it had not
//!   stored. A node whose position was trimmed away, or whose group is new
//!   while others exist, repairs by negentropy against a peer.
//! - **Global limits** (`limits.rs`): each node keeps its local buckets
//!   (admission stays local, atomics and one short lock), counts each
//!   client's use, and every `limits_tick_ms` adds it to per-client
//!   counters in Redis with one Lua call; what the other nodes' clients
//!   took since the last tick is charged to the same keys here as debt.
//! - **Registry** (`registry.rs`): each node's advertised URL (for
//!   repair) and heartbeat, the stream lag gauge.
//!
//! - **Sentinel** (`sentinel.rs`, with `cluster.sentinels`): the primary
//!   is whatever the Sentinels name; the node asks them at start, on any
//!   Redis error, and hears `+switch-master` from them. On a switch every
//!   task drops its connection (the generation moves), the consumer joins
//!   its group again on the new primary (replicated, or created), and a
//!   repair runs: what the old primary acknowledged but had not replicated
//!   is fetched from the peers that hold it.
//!
//! Redis away: the node serves on local limits, holds outbound events in
//! the tap's bounded channel, says so on /metrics and /readyz, reconnects
//! with backoff, and repairs from a peer when Redis is back.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod config;
mod lease;
mod limits;
pub mod metrics_names;
mod registry;
mod sentinel;
mod stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_engine::Engine;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::ClusterConfig;

use crate::metrics_names as m;

/// What a repair moved: `(events the peer had and this node lacked,
/// of which stored)`.
pub type RepairResult = Result<(usize, usize), String>;

/// Reconciles this node's events created at or after `since` (unix
/// seconds) with the relay at the URL, downloading what is missing here
/// (the binary provides it: NIP-77 through `sluice sync`'s code).
pub type RepairFn =
    Arc<dyn Fn(String, u64) -> Pin<Box<dyn Future<Output = RepairResult> + Send>> + Send + Sync>;

/// Redis commands each task issues, for labels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Task {
    Publish = 0,
    Consume = 1,
    Limits = 2,
    Registry = 3,
}

impl Task {
    fn label(self) -> &'static str {
        match self {
            Task::Publish => "publish",
            Task::Consume => "consume",
            Task::Limits => "limits",
            Task::Registry => "registry",
        }
    }
}

/// State the cluster's tasks share.
pub(crate) struct Shared {
    pub cfg: ClusterConfig,
    pub node_id: String,
    pub advertise_url: String,
    pub engine: Arc<Engine>,
    /// The Redis server the tasks connect to: fixed (`redis_url`), or the
    /// primary the Sentinels last named.
    primary: Mutex<Primary>,
    /// Moves each time the primary changes: a connection made under an
    /// older generation is dropped.
    generation: AtomicU64,
    /// Wakes the Sentinel task to ask the Sentinels again (a Redis error).
    pub sentinel_wake: Notify,
    pub repair: RepairFn,
    /// The pubkeys this node shows every private event to (hex), in its
    /// heartbeat; `None` when nothing is private here.
    pub full_readers: Option<Vec<String>>,
    /// Per task: whether its last Redis command succeeded.
    up: [AtomicBool; 4],
    /// Unix ms when Redis was first seen down in the current outage (0:
    /// up).
    down_since_ms: AtomicU64,
    /// Set when something calls for a repair (a gap, a new group, Redis
    /// back after an outage); the registry task runs it.
    pub repair_wanted: AtomicBool,
    /// Wakes the heartbeat at once (a repair wanted: the registry's view
    /// made fresh for it).
    pub beat_wake: Notify,
    /// Each global limit's share enforced here while Redis is away.
    pub lease: lease::Lease,
    pub stop: CancellationToken,
}

/// The Redis server currently followed.
pub(crate) struct Primary {
    /// `host:port` (empty before the Sentinels first answered).
    pub addr: String,
    pub client: Option<redis::Client>,
    /// Unix ms of the last change (0: never changed since start).
    pub changed_ms: u64,
}

impl Shared {
    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.cfg.key_prefix)
    }

    pub(crate) fn stream_key(&self) -> String {
        self.key("events")
    }

    /// Connection options: every command bounded by `redis_timeout_ms`,
    /// plus `extra` for a blocking read.
    pub(crate) async fn connect(
        &self,
        extra: Duration,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let t = Duration::from_millis(self.cfg.redis_timeout_ms);
        let opts = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(t))
            .set_response_timeout(Some(t + extra));
        let client = self.primary.lock().client.clone();
        let Some(client) = client else {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no Redis primary known yet (the Sentinels have not answered)",
            )));
        };
        client
            .get_multiplexed_async_connection_with_config(&opts)
            .await
    }

    /// The primary's generation: compare with the one a connection was
    /// made under ([`Shared::stale`]).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Drops `conn` when the primary changed since `made` (its
    /// generation), and brings `made` up to date.
    pub(crate) fn drop_stale<C>(&self, conn: &mut Option<C>, made: &mut u64) {
        let now = self.generation();
        if *made != now {
            *conn = None;
            *made = now;
        }
    }

    /// Follows the primary at `addr` (`host:port`, as the Sentinels name
    /// it); true when it changed. A change after the first is a failover:
    /// every task reconnects, and a repair fetches what the old primary
    /// had acknowledged but not replicated.
    pub(crate) fn set_primary(&self, addr: &str, why: &str) -> bool {
        let url = sentinel::primary_url(&self.cfg.redis_url, addr);
        let client = match redis::Client::open(url.as_str()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(primary = addr, error = %e, "cluster: cannot use the primary the Sentinels name");
                return false;
            }
        };
        let now = now_ms();
        let (old, first) = {
            let mut p = self.primary.lock();
            if p.addr == addr {
                return false;
            }
            let old = std::mem::replace(&mut p.addr, addr.to_string());
            p.client = Some(client);
            p.changed_ms = now;
            (old.clone(), old.is_empty())
        };
        self.generation.fetch_add(1, Ordering::AcqRel);
        metrics::gauge!(m::CLUSTER_PRIMARY, "addr" => addr.to_string()).set(1.0);
        if !first {
            metrics::gauge!(m::CLUSTER_PRIMARY, "addr" => old.clone()).set(0.0);
            metrics::counter!(m::CLUSTER_PRIMARY_CHANGES_TOTAL).increment(1);
        }
        metrics::gauge!(m::CLUSTER_PRIMARY_CHANGED_TIMESTAMP_SECONDS).set(now as f64 / 1000.0);
        self.engine.set_note(
            "cluster-primary",
            Some(format!(
                "Redis primary {addr} (Sentinel master {:?}), since unix ms {now}{}",
                self.cfg.sentinel_master,
                if first {
                    String::new()
                } else {
                    format!(", after a failover from {old}")
                }
            )),
        );
        if first {
            tracing::info!(
                primary = addr,
                "cluster: the Sentinels name the Redis primary"
            );
        } else {
            tracing::warn!(
                from = %old,
                to = addr,
                why,
                "cluster: Redis primary changed (failover); reconnecting and repairing from the peers"
            );
            self.want_repair();
        }
        true
    }

    /// Records the outcome of a task's Redis command: metrics, the
    /// /readyz note, and a repair once Redis is back after an outage.
    pub(crate) fn report(&self, task: Task, ok: bool, err: Option<&redis::RedisError>) {
        if let Some(e) = err {
            if !self.cfg.sentinels.is_empty() {
                // The primary may have moved: ask the Sentinels again.
                self.sentinel_wake.notify_one();
            }
            metrics::counter!(m::CLUSTER_REDIS_ERRORS_TOTAL, "task" => task.label()).increment(1);
            if self.up[task as usize].load(Ordering::Relaxed) {
                tracing::warn!(task = task.label(), error = %e, "cluster: Redis command failed");
            }
        }
        self.up[task as usize].store(ok, Ordering::Relaxed);
        let all_up = self.up.iter().all(|u| u.load(Ordering::Relaxed));
        metrics::gauge!(m::CLUSTER_REDIS_UP).set(if all_up { 1.0 } else { 0.0 });
        if all_up {
            let since = self.down_since_ms.swap(0, Ordering::Relaxed);
            if since != 0 {
                tracing::info!(
                    down_ms = now_ms().saturating_sub(since),
                    "cluster: Redis reachable again; global limits back, repairing from a peer"
                );
                self.engine.set_note("cluster", None);
                self.lease_end();
                self.want_repair();
            }
        } else if self
            .down_since_ms
            .compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::error!(
                "cluster: Redis unreachable; serving with local limits (each global limit's \
                 leased share), replication held (up to cluster.outbound_buffer events)"
            );
            self.lease_start();
            let lease = if self.lease.active() {
                format!(
                    " (each global limit's share: {:.3})",
                    self.engine.limiter().lease_share()
                )
            } else {
                String::new()
            };
            self.engine.set_note(
                "cluster",
                Some(format!(
                    "Redis {} unreachable: local limits only{lease}, replication paused",
                    self.redis_name()
                )),
            );
        }
    }

    /// What the logs and /readyz call the Redis server followed.
    fn redis_name(&self) -> String {
        if self.cfg.sentinels.is_empty() {
            return redact(&self.cfg.redis_url);
        }
        let addr = self.primary.lock().addr.clone();
        format!(
            "primary {addr} (Sentinel master {:?})",
            self.cfg.sentinel_master
        )
    }

    pub(crate) fn want_repair(&self) {
        self.repair_wanted.store(true, Ordering::Relaxed);
        self.beat_wake.notify_one();
    }
}

/// The Redis URL without a password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The running cluster tasks.
pub struct Cluster {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Cluster {
    /// Attaches to `engine` and starts the publisher, consumer, limits and
    /// registry tasks on the current tokio runtime. `listen` (the bound
    /// address) makes the default advertised URL. `full_readers`: the
    /// pubkeys this node shows every private event to (`auth.full_readers`,
    /// with the repair key's), or `None` when it has no private kinds; the
    /// registry advertises them, and a peer whose repair key is not among
    /// them does not repair from this node (it could not read everything).
    /// Fails only on a config Redis' client refuses (an unreachable Redis is
    /// not an error: the node serves and retries).
    pub fn start(
        cfg: ClusterConfig,
        engine: Arc<Engine>,
        listen: std::net::SocketAddr,
        repair: RepairFn,
        full_readers: Option<Vec<[u8; 32]>>,
    ) -> Result<Cluster, String> {
        let client = if cfg.sentinels.is_empty() {
            Some(
                redis::Client::open(cfg.redis_url.as_str())
                    .map_err(|e| format!("cluster.redis_url: {e}"))?,
            )
        } else {
            // The address comes from the Sentinels; check the rest now.
            let probe = sentinel::primary_url(&cfg.redis_url, "127.0.0.1:6379");
            redis::Client::open(probe.as_str()).map_err(|e| format!("cluster.redis_url: {e}"))?;
            None
        };
        let node_id = if cfg.node_id.is_empty() {
            host_name()
        } else {
            cfg.node_id.clone()
        };
        let advertise_url = if cfg.advertise_url.is_empty() {
            let host = if listen.ip().is_unspecified() {
                host_name()
            } else {
                listen.ip().to_string()
            };
            format!("ws://{host}:{}", listen.port())
        } else {
            cfg.advertise_url.clone()
        };
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            node_id,
            advertise_url,
            engine: engine.clone(),
            primary: Mutex::new(Primary {
                addr: String::new(),
                client,
                changed_ms: 0,
            }),
            generation: AtomicU64::new(0),
            sentinel_wake: Notify::new(),
            repair,
            full_readers: full_readers.map(|pks| {
                pks.iter()
                    .map(|pk| sluice_proto::hex32::encode(pk))
                    .collect()
            }),
            up: std::array::from_fn(|_| AtomicBool::new(true)),
            down_since_ms: AtomicU64::new(0),
            repair_wanted: AtomicBool::new(false),
            beat_wake: Notify::new(),
            lease: lease::Lease::new(),
            stop: stop.clone(),
            cfg,
        });
        metrics::gauge!(m::CLUSTER_REDIS_UP).set(1.0);
        metrics::gauge!(m::CLUSTER_LEASE_SHARE).set(1.0);
        metrics::gauge!(m::CLUSTER_LEASE_NODES).set(1.0);
        metrics::counter!(m::CLUSTER_LEASES_TOTAL).increment(0);
        metrics::counter!(m::CLUSTER_LEASE_OPS_TOTAL).increment(0);
        tracing::info!(
            node = %shared.node_id,
            redis = %shared.redis_name(),
            advertise = %shared.advertise_url,
            "cluster mode"
        );
        let (tx, rx) = tokio::sync::mpsc::channel(shared.cfg.outbound_buffer);
        engine.attach_replication(tx);
        if shared.cfg.global_limits {
            engine.limiter().track_usage();
        }
        let tracker = TaskTracker::new();
        if !shared.cfg.sentinels.is_empty() {
            sentinel::spawn(&tracker, shared.clone());
        }
        tracker.spawn(stream::publish(shared.clone(), rx));
        tracker.spawn(stream::consume(shared.clone()));
        if shared.cfg.global_limits {
            tracker.spawn(limits::reconcile(shared.clone()));
        }
        tracker.spawn(registry::run(shared));
        tracker.close();
        Ok(Cluster { tracker, stop })
    }

    /// Stops the tasks (the publisher first flushes what it holds, for at
    /// most `redis_timeout_ms`) and waits for them.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tracker.wait().await;
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    if clean.is_empty() {
        "node".into()
    } else {
        clean
    }
}
