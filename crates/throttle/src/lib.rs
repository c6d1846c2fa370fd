//! Sluice's throttling logic, pure and deterministic: the PID controller and
//! the load signals it acts on, token buckets with burst per client, the
//! fair query scheduler and its cost model (where each comes from:
//! docs/design.md),
//! emergency mode and the admission decisions that combine them.
//!
//! Architecture invariant: this crate reads no clock, spawns nothing, does
//! no I/O and depends on no other Sluice crate. Time comes in as `now_ns`,
//! nanoseconds of the caller's monotonic clock, so a simulation drives it
//! exactly (see `tests/simulation.rs`). The engine owns the clock, the
//! sampling task, the atomics the verdicts are published through, the
//! locks around the bucket maps, the metrics, and the waiting.
//!
//! Map of the crate:
//! - [`config`]: the `[throttle]` section of the configuration, one type
//!   per table: [`ThrottleConfig`], [`ClientsConfig`], [`QueriesConfig`],
//!   [`ReliefConfig`] (and the tables owned by the modules below). An
//!   error names the key as the operator writes it (`throttle.read.kp`).
//! - [`pid`]: [`Pid`], [`PidConfig`] (`write_default`, `read_default`,
//!   `import_default`), [`PidState`].
//! - [`signals`]: [`LoadSignals`] (raw), [`NormalizedSignals`] (0..1+),
//!   [`memory_pressure`], [`process_variable`].
//! - [`emergency`]: [`Emergency`] with hysteresis.
//! - [`governor`]: [`Governor::tick`], one tick of the global loop.
//! - [`admission`]: [`Verdict`] (go, wait, refuse: published per direction
//!   by the governor, answered per operation by admission), [`Mode`],
//!   [`Decision`], [`DelayBatcher`] (batching of delays,
//!   docs/design.md#pid-control).
//! - [`connection`]: [`client_key`] (IPv4, or the IPv6 /64) and
//!   [`ConnPacer`], what a published verdict means for one operation of
//!   one connection (politeness, batching, reads never delayed).
//! - [`policy`]: the admission of one operation, decided in one place
//!   ([`policy::Admission`]): which buckets are charged by tier, the
//!   controller's verdict through the connection's pacer, shadow mode,
//!   delays scaled by weight, refunds, the layer that refused and its text.
//! - [`refusal`]: [`RateLimited`], the one refusal: its [`Layer`] and its
//!   [`Cause`] (both metric labels), retry hint and text.
//! - [`bucket`]: [`TokenBucket`], [`scaled_rate`]; [`keyed`]:
//!   [`KeyedBuckets`] per IP or pubkey, bounded.
//! - [`budgets`]: `[[throttle.budgets]]`, budgets in a hierarchy (the
//!   relay, classes of clients, the per-client buckets as leaves), their
//!   validation (P77-3) and [`BudgetTree`], charged all or nothing along
//!   the path, borrowing up to a ceiling as HTB does.
//! - [`trust`]: `[trust]`, the web of trust as distances from the seed
//!   pubkeys over the stored follow lists ([`TrustGraph`], bounded), and
//!   what an outsider's write meets ([`OutsiderWrites`]).
//! - [`pow`]: `[pow]`, NIP-13 difficulty floors and the adaptive
//!   difficulty ([`PowController`]).
//! - [`fair`]: [`FairQueue`], the query scheduler: per-client queues, deficit
//!   round robin by cost, new flows first, deadlines, bounded steps.
//! - [`cost`]: [`CostConfig`], a query's cost estimated from its plan
//!   ([`FilterShape`]) and settled from the rows it scanned and the bytes
//!   it sent.
//! - [`meter`]: [`RateMeter`], a connection's own rate, to aim the
//!   controller at the connections that cause the load.
//! - [`net`]: [`IpBlock`], the address block of every list of addresses
//!   (trusted proxies, `metrics.allow_from`, denied and blocked addresses),
//!   compared with canonical addresses only (an IPv4-mapped IPv6 address
//!   or block is its IPv4 one).
//!
//! Every constructor validates its config and returns [`ConfigError`];
//! nothing on the hot path fails or panics: runtime inputs are clamped.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod admission;
pub mod aimd;
pub mod bucket;
pub mod budgets;
pub mod config;
pub mod connection;
pub mod cost;
pub mod emergency;
mod error;
pub mod fair;
pub mod governor;
pub mod keyed;
pub mod meter;
pub mod net;
pub mod pid;
pub mod pow;
pub mod refusal;
pub mod room;
pub mod signals;
pub mod tiers;
pub mod trust;
pub mod verdict;

pub use bucket::{BucketConfig, BucketPools, TokenBucket, scaled_rate};
pub use budgets::{BudgetConfig, BudgetTree};
pub use config::{ClientsConfig, QueriesConfig, QuerySlots, ReliefConfig, ThrottleConfig};
pub use connection::{ConnPacer, client_key};
pub use cost::{CostConfig, FilterShape};
pub use emergency::{Emergency, EmergencyConfig};
pub use error::ConfigError;
pub use fair::{AfterStep, FairQueue, FairStats, JobId, StepFate};
pub use governor::{DirectionState, Governor, GovernorState};
pub use keyed::{KeyedBuckets, KeyedStats};
pub use meter::RateMeter;
pub use net::{BlockError, IpBlock};
pub use pid::{Pid, PidConfig, PidState};
pub use pow::{PowConfig, PowController};
pub use refusal::{Cause, Layer, RateLimited};
pub use signals::{
    LoadSignals, NormalizedSignals, SignalTargets, memory_pressure, process_variable,
};
pub use tiers::{ClientKey, Principal, Tier, Tiers, TiersConfig};
pub use trust::{DistanceTiers, Explanation, OutsiderWrites, TrustConfig, TrustGraph};
pub use verdict::{Decision, DelayBatcher, Direction, Mode, Verdict};
