//! What the writer applies: the store's write rules and when to remove,
//! shared with the writer thread (a reload swaps it).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_proto::hex32;
use sluice_store::{Retention, Rule, Scope, WriteRules};

use super::config::RetentionConfig;

/// What the writer applies: the store's write rules and when to remove.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetentionPlan {
    pub rules: WriteRules,
    /// 0: no size target.
    pub target_bytes: u64,
    pub low_bytes: u64,
    pub interval: Duration,
    pub step_events: usize,
    pub step_time: Duration,
    /// The NIP-11 `retention` field.
    pub nip11: Vec<serde_json::Value>,
}

impl RetentionPlan {
    pub(super) fn retention(&self) -> &Retention {
        &self.rules.retention
    }

    /// Size phases: the scopes of age rules, shortest life first, then
    /// everything.
    pub fn size_phases(&self) -> Vec<Scope> {
        let mut aged: Vec<(u64, Scope)> = self
            .retention()
            .rules
            .iter()
            .filter_map(|r| Some((r.max_age_secs?, Scope::of_kinds(&r.kinds))))
            .collect();
        aged.sort_by_key(|(age, _)| *age);
        let mut phases: Vec<Scope> = Vec::new();
        for (_, s) in aged {
            if !phases.contains(&s) {
                phases.push(s);
            }
        }
        if !phases.contains(&Scope::All) {
            phases.push(Scope::All);
        }
        phases
    }

    pub(super) fn counts_any(&self, kind: u16) -> bool {
        self.retention().rules.iter().any(|r| r.counts(kind))
    }
}

/// The plan shared between the engine (which sets it) and the writer
/// (which picks up a new one between batches).
pub(crate) struct SharedPlan {
    plan: Mutex<Arc<RetentionPlan>>,
    generation: AtomicU64,
}

impl Default for SharedPlan {
    /// No rules, no target: nothing is removed.
    fn default() -> Self {
        SharedPlan {
            plan: Mutex::new(Arc::new(
                RetentionConfig::default().plan(std::iter::empty(), Vec::new()),
            )),
            generation: AtomicU64::new(0),
        }
    }
}

impl SharedPlan {
    pub(crate) fn set(&self, plan: RetentionPlan) {
        *self.plan.lock() = Arc::new(plan);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn get(&self) -> Arc<RetentionPlan> {
        self.plan.lock().clone()
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

impl RetentionConfig {
    /// The plan the writer runs: these rules, exempting also `extra`
    /// (admins, listed tiers), with `relay_urls` naming this relay for
    /// NIP-62.
    pub fn plan(
        &self,
        extra_exempt: impl IntoIterator<Item = [u8; 32]>,
        relay_urls: Vec<String>,
    ) -> RetentionPlan {
        let mut exempt: HashSet<[u8; 32]> = self
            .exempt_pubkeys
            .iter()
            .filter_map(|p| hex32::decode(p))
            .collect();
        exempt.extend(extra_exempt);
        let target_bytes = self.max_store_mb.saturating_mul(1 << 20);
        RetentionPlan {
            rules: WriteRules {
                retention: Retention {
                    rules: self
                        .rules
                        .iter()
                        .map(|r| Rule {
                            kinds: r.kinds.clone(),
                            max_age_secs: r.max_age_secs,
                            keep_per_author: r.keep_per_author,
                        })
                        .collect(),
                    exempt,
                    size_target: target_bytes > 0,
                },
                relay_urls,
            },
            target_bytes,
            low_bytes: (target_bytes as f64 * self.low_watermark) as u64,
            interval: Duration::from_secs(self.interval_secs),
            step_events: self.step_events,
            step_time: Duration::from_millis(self.step_ms),
            nip11: self.nip11(),
        }
    }
}
