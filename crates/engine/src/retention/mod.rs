//! Retention, run by the writer thread between client batches.
//!
//! `[retention]` ([`RetentionConfig`]) names a size target and rules; the
//! binary turns it into a [`RetentionPlan`] (adding the exempt pubkeys of
//! other sections) and hands it to [`crate::Engine::set_retention`], again
//! on SIGHUP. The writer's [`Retainer`] runs at most one bounded step (one
//! write transaction of at most `step_events` removals and `step_ms`) after
//! a client batch, and steps back to back while the queue is empty, so a
//! client's EVENT never waits for more than one step. Between client
//! batches retention takes at most 30% of the writer's time, unless the
//! store is 5% over its size target.
//!
//! Work, in order of urgency:
//! 1. size: while the store's used bytes are over `max_store_mb`, until
//!    they are under `low_watermark` × the target, the oldest events go
//!    first: those of age rules, shortest life first, then every other
//!    kind. Each phase's newest removed `created_at` is kept as its
//!    horizon: an older event of that scope is not stored again.
//! 2. age rules, every `interval_secs`: each rule's events older than its
//!    `max_age_secs`.
//! 3. per-author counts: the authors of stored events a count rule covers
//!    are marked (a bounded set; past it, a sweep of every author runs),
//!    and each marked author's events beyond the newest `keep_per_author`
//!    go. A sweep also runs at start and after a reload.

mod config;
mod dry_run;
mod plan;
mod retainer;

pub use config::{RetentionConfig, RetentionRuleConfig};
pub use dry_run::DryRun;
pub use plan::RetentionPlan;
pub(crate) use plan::SharedPlan;
pub(crate) use retainer::Retainer;
