//! The writer's retainer: one bounded retention step at a time.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_store::{Pruned, Scan, Scope, Store, StoreError, WriteOutcome};

use crate::metrics_names as m;

use super::plan::{RetentionPlan, SharedPlan};

/// Authors marked for a per-author count check, at most this many; past
/// it, a sweep of every author runs instead.
const MAX_MARKED: usize = 65_536;
/// Authors a sweep step reads.
const SWEEP_AUTHORS: usize = 256;
/// How often the store's used bytes are read while under the target.
const SIZE_CHECK_EVERY: Duration = Duration::from_millis(250);
/// After a size pass that found nothing left to remove, how long before
/// trying again.
const SIZE_STUCK_PAUSE: Duration = Duration::from_secs(10);
/// Between client batches, retention takes at most this share of the
/// writer's time (an idle writer steps back to back)...
const BUSY_SHARE: f64 = 0.3;
/// ...unless the store is this far over its size target.
const URGENT_OVER: f64 = 1.05;

/// The writer's retention state.
pub(crate) struct Retainer {
    shared: Arc<SharedPlan>,
    generation: u64,
    plan: Arc<RetentionPlan>,
    phases: Vec<Scope>,
    /// Size eviction running (over the target, not yet under the low mark).
    size_active: bool,
    size_phase: usize,
    size_resume: Option<(u64, u64)>,
    next_size_check: Instant,
    /// Age pass running: rule index and resume position.
    age_active: bool,
    age_rule: usize,
    age_resume: Option<(u64, u64)>,
    age_due: Instant,
    marked: HashSet<[u8; 32]>,
    /// `Some(cursor)` while a sweep of every author runs.
    sweep: Option<Option<[u8; 32]>>,
    /// When the last step ended and how long it ran (pacing between
    /// client batches).
    last_end: Instant,
    last_len: Duration,
    /// The store is over the target by [`URGENT_OVER`]: no pacing.
    urgent: bool,
    /// Events a step picks now: adapted so a whole step, its commit
    /// included (scattered removals dirty many pages), fits in `step_ms`;
    /// at most `step_events`.
    pick: usize,
    /// Events the current step removed.
    removed: u64,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the writer's Retainer runs retention's steps (clippy.toml)"
)]
impl Retainer {
    pub(crate) fn new(shared: Arc<SharedPlan>) -> Retainer {
        let plan = shared.get();
        let mut r = Retainer {
            generation: shared.generation(),
            shared,
            phases: plan.size_phases(),
            plan,
            size_active: false,
            size_phase: 0,
            size_resume: None,
            next_size_check: Instant::now(),
            age_active: false,
            age_rule: 0,
            age_resume: None,
            age_due: Instant::now(),
            marked: HashSet::new(),
            sweep: None,
            last_end: Instant::now(),
            last_len: Duration::ZERO,
            urgent: false,
            pick: 0,
            removed: 0,
        };
        r.restart();
        r
    }

    /// The write rules in force (picking up a new plan first).
    pub(crate) fn rules(&mut self) -> Arc<RetentionPlan> {
        self.refresh();
        self.plan.clone()
    }

    fn refresh(&mut self) {
        let g = self.shared.generation();
        if g != self.generation {
            self.generation = g;
            self.plan = self.shared.get();
            self.phases = self.plan.size_phases();
            self.restart();
        }
    }

    /// A new plan (or the first): everything runs again from the start.
    fn restart(&mut self) {
        self.pick = self.plan.step_events;
        self.size_active = false;
        self.size_phase = 0;
        self.size_resume = None;
        self.next_size_check = Instant::now();
        self.age_active = false;
        self.age_rule = 0;
        self.age_resume = None;
        self.age_due = Instant::now();
        self.marked.clear();
        let counts = self
            .plan
            .retention()
            .rules
            .iter()
            .any(|r| r.keep_per_author.is_some());
        self.sweep = counts.then_some(None);
    }

    /// Marks the authors of stored events a count rule covers.
    pub(crate) fn note_stored<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for ev in events {
            if !self.plan.counts_any(ev.kind) || self.plan.retention().exempt.contains(&ev.pubkey) {
                continue;
            }
            if self.marked.len() < MAX_MARKED {
                self.marked.insert(ev.pubkey);
            } else if self.sweep.is_none() {
                self.sweep = Some(None);
            }
        }
    }

    /// When the writer should next look, if nothing arrives: `None` when
    /// work is pending now.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if self.size_active || self.age_active || !self.marked.is_empty() || self.sweep.is_some() {
            return None;
        }
        let far = Instant::now() + Duration::from_secs(3600);
        let mut due = far;
        if self
            .plan
            .retention()
            .rules
            .iter()
            .any(|r| r.max_age_secs.is_some())
        {
            due = due.min(self.age_due);
        }
        if self.plan.target_bytes > 0 {
            due = due.min(self.next_size_check);
        }
        Some(due)
    }

    /// Whether to take a step between two client batches: always when the
    /// store is [`URGENT_OVER`] its target; never while size eviction rides
    /// on the batches (the step's own commit would only hold the next
    /// batch, and a person's EVENT in it, behind one more flush); otherwise
    /// when it keeps retention within [`BUSY_SHARE`] of the writer's time.
    pub(crate) fn step_between_batches(&self) -> bool {
        if self.urgent {
            return true;
        }
        if self.rides() {
            return false;
        }
        let rest = self.last_len.mul_f64((1.0 - BUSY_SHARE) / BUSY_SHARE);
        self.last_end.elapsed() >= rest
    }

    /// Runs at most one bounded step of whatever is most urgent. Returns
    /// whether it did anything.
    pub(crate) fn step(&mut self, store: &Store, now_unix: u64) -> bool {
        self.refresh();
        let started = Instant::now();
        self.removed = 0;
        let result = self.step_inner(store, now_unix);
        self.last_end = Instant::now();
        self.last_len = self.last_end - started;
        self.adapt_pick();
        let did = match result {
            Ok(did) => did,
            Err(e) => {
                tracing::error!(error = %e, "retention step failed");
                metrics::counter!(m::RETENTION_ERRORS_TOTAL).increment(1);
                // Do not spin on a failing store: try again later.
                self.size_active = false;
                self.next_size_check = Instant::now() + SIZE_STUCK_PAUSE;
                self.age_active = false;
                self.age_due = Instant::now() + self.plan.interval;
                self.marked.clear();
                self.sweep = None;
                true
            }
        };
        if did {
            metrics::histogram!(m::RETENTION_STEP_SECONDS).record(started.elapsed().as_secs_f64());
        }
        did
    }

    /// Fits the next step's pick to `step_ms` from how long this one took,
    /// when it removed anything: down in proportion when it ran over, up by
    /// a quarter when it removed all it picked in under half of it.
    fn adapt_pick(&mut self) {
        if self.removed == 0 {
            return;
        }
        let full = self.removed >= self.pick as u64;
        let budget = self.plan.step_time.as_secs_f64();
        let took = self.last_len.as_secs_f64();
        let max = self.plan.step_events.max(1);
        if took > budget {
            self.pick = ((self.pick as f64 * budget / took * 0.9) as usize).clamp(8, max);
        } else if took < budget / 2.0 && full {
            self.pick = (self.pick + self.pick / 4 + 1).min(max);
        }
    }

    fn step_inner(&mut self, store: &Store, now_unix: u64) -> Result<bool, StoreError> {
        if self.size_step(store)? {
            return Ok(true);
        }
        if self.age_step(store, now_unix)? {
            return Ok(true);
        }
        if self.count_step(store)? {
            return Ok(true);
        }
        self.sweep_step(store)
    }

    /// Whether the next client batch should carry size eviction in its own
    /// transaction (eviction is running).
    pub(crate) fn rides(&self) -> bool {
        self.size_active && self.plan.target_bytes > 0 && self.size_phase < self.phases.len()
    }

    /// Writes a client batch of `n` events and, in the same transaction,
    /// removes up to twice as many of the oldest events of the current size
    /// phase (at most `step_ms` of removals): eviction keeps pace with the
    /// writes at no extra commit. Call when [`Retainer::rides`].
    pub(crate) fn write_evicting<'a>(
        &mut self,
        store: &Store,
        events: impl IntoIterator<Item = &'a Event>,
        n: usize,
        now_unix: u64,
    ) -> Result<Vec<WriteOutcome>, StoreError> {
        let plan = self.plan.clone();
        // `rides` said a phase is left; past the last one, nothing is picked.
        let (scope, max_pick) = match self.phases.get(self.size_phase) {
            Some(scope) => (scope.clone(), n.saturating_mul(2).clamp(16, 2048)),
            None => (Scope::All, 0),
        };
        let scan = Scan {
            scope: &scope,
            before: u64::MAX,
            after: self.size_resume,
            replaceable: false,
            exempt: &plan.retention().exempt,
            max_pick,
            // Read on every client batch while eviction runs: in
            // proportion to what it may pick, not the step's bound.
            max_examine: max_pick.saturating_mul(8).max(64),
            max_time: plan.step_time,
        };
        let (out, pruned) = store.write_batch_evicting(events, now_unix, &plan.rules, &scan)?;
        if pruned.removed > 0 {
            // The removals' own time: the commit is the batch's anyway.
            metrics::histogram!(m::RETENTION_STEP_SECONDS).record(pruned.took.as_secs_f64());
        }
        self.size_removed(store, &pruned)?;
        Ok(out)
    }

    fn size_step(&mut self, store: &Store) -> Result<bool, StoreError> {
        let plan = self.plan.clone();
        if plan.target_bytes == 0 {
            return Ok(false);
        }
        let now = Instant::now();
        if !self.size_active {
            if now < self.next_size_check {
                return Ok(false);
            }
            self.next_size_check = now + SIZE_CHECK_EVERY;
            let used = store.used_bytes()?;
            metrics::gauge!(m::STORE_USED_BYTES).set(used as f64);
            if used <= plan.target_bytes {
                self.urgent = false;
                return Ok(false);
            }
            tracing::info!(
                used_mb = used >> 20,
                target_mb = plan.target_bytes >> 20,
                "store over retention.max_store_mb: removing the oldest events"
            );
            self.size_active = true;
            self.size_phase = 0;
            self.size_resume = None;
        }
        let Some(scope) = self.phases.get(self.size_phase) else {
            tracing::warn!(
                target_mb = plan.target_bytes >> 20,
                "store still over retention.max_store_mb with nothing left to remove \
                 (every remaining event is exempt or a current replaceable version)"
            );
            self.size_active = false;
            self.next_size_check = now + SIZE_STUCK_PAUSE;
            return Ok(true);
        };
        let scan = Scan {
            scope,
            before: u64::MAX,
            after: self.size_resume,
            replaceable: false,
            exempt: &plan.retention().exempt,
            max_pick: self.pick,
            max_examine: plan.step_events.saturating_mul(8),
            max_time: plan.step_time,
        };
        let pruned = store.prune_oldest(&scan, true)?;
        self.removed += pruned.removed;
        self.size_removed(store, &pruned)?;
        Ok(true)
    }

    /// After a size removal (a step, or one riding on a batch): counts it,
    /// moves to the next phase when this one is exhausted, and stops at the
    /// low mark.
    fn size_removed(&mut self, store: &Store, pruned: &Pruned) -> Result<(), StoreError> {
        count_removed("size", pruned.removed);
        match pruned.next {
            Some(next) => self.size_resume = Some(next),
            None => {
                self.size_phase += 1;
                self.size_resume = None;
            }
        }
        let plan = &self.plan;
        let used = store.used_bytes()?;
        metrics::gauge!(m::STORE_USED_BYTES).set(used as f64);
        self.urgent = used as f64 > plan.target_bytes as f64 * URGENT_OVER;
        if used < plan.low_bytes {
            self.size_active = false;
            self.next_size_check = Instant::now() + SIZE_CHECK_EVERY;
        }
        Ok(())
    }

    fn age_step(&mut self, store: &Store, now_unix: u64) -> Result<bool, StoreError> {
        if !self.age_active {
            if !self
                .plan
                .retention()
                .rules
                .iter()
                .any(|r| r.max_age_secs.is_some())
            {
                return Ok(false);
            }
            if Instant::now() < self.age_due {
                return Ok(false);
            }
            self.age_active = true;
            self.age_rule = 0;
            self.age_resume = None;
        }
        let plan = self.plan.clone();
        let rules = &plan.retention().rules;
        while let Some(rule) = rules.get(self.age_rule) {
            let Some(cutoff) = rule.age_cutoff(now_unix) else {
                self.age_rule += 1;
                continue;
            };
            let scope = Scope::of_kinds(&rule.kinds);
            let scan = Scan {
                scope: &scope,
                before: cutoff,
                after: self.age_resume,
                replaceable: !rule.kinds.is_empty(),
                exempt: &plan.retention().exempt,
                max_pick: self.pick,
                max_examine: plan.step_events.saturating_mul(8),
                max_time: plan.step_time,
            };
            let pruned = store.prune_oldest(&scan, false)?;
            self.removed += pruned.removed;
            count_removed(&self.age_rule.to_string(), pruned.removed);
            match pruned.next {
                Some(next) => self.age_resume = Some(next),
                None => {
                    self.age_rule += 1;
                    self.age_resume = None;
                }
            }
            return Ok(true);
        }
        self.age_active = false;
        self.age_due = Instant::now() + plan.interval;
        Ok(false)
    }

    fn count_step(&mut self, store: &Store) -> Result<bool, StoreError> {
        let Some(&author) = self.marked.iter().next() else {
            return Ok(false);
        };
        self.marked.remove(&author);
        let plan = self.plan.clone();
        let mut budget = self.pick;
        for (i, rule) in plan.retention().rules.iter().enumerate() {
            let Some(keep) = rule.keep_per_author else {
                continue;
            };
            if budget == 0 {
                self.marked.insert(author);
                break;
            }
            let (removed, more) =
                store.prune_author_excess(&author, &rule.kinds, keep, budget, plan.step_time)?;
            count_removed(&i.to_string(), removed);
            self.removed += removed;
            budget = budget.saturating_sub(removed as usize);
            if more {
                self.marked.insert(author);
            }
        }
        Ok(true)
    }

    fn sweep_step(&mut self, store: &Store) -> Result<bool, StoreError> {
        let Some(cursor) = self.sweep else {
            return Ok(false);
        };
        if self.marked.len() + SWEEP_AUTHORS > MAX_MARKED {
            return Ok(false);
        }
        let authors = store.authors_after(cursor.as_ref(), SWEEP_AUTHORS)?;
        self.sweep = authors.last().map(|a| Some(*a));
        let exempt = &self.plan.retention().exempt;
        self.marked
            .extend(authors.into_iter().filter(|a| !exempt.contains(a)));
        Ok(true)
    }
}

fn count_removed(rule: &str, n: u64) {
    if n > 0 {
        metrics::counter!(m::RETENTION_DELETED_TOTAL, "rule" => rule.to_string()).increment(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retention::RetentionConfig;

    #[test]
    fn no_step_between_batches_while_riding_eviction_keeps_pace_unless_far_over() {
        let shared = Arc::new(SharedPlan::default());
        let cfg = RetentionConfig {
            max_store_mb: 1,
            ..RetentionConfig::default()
        };
        shared.set(cfg.plan(std::iter::empty(), Vec::new()));
        let mut r = Retainer::new(shared);
        // The last step ended long ago: pacing allows one.
        r.last_end = Instant::now() - Duration::from_secs(60);
        r.last_len = Duration::from_millis(10);
        assert!(!r.rides());
        assert!(r.step_between_batches(), "a size check, the other rules");
        // Over the target: eviction rides on the client batches.
        r.size_active = true;
        assert!(r.rides());
        assert!(!r.step_between_batches(), "riding keeps pace");
        r.urgent = true;
        assert!(r.step_between_batches(), "far over the target: steps help");
        // Pacing still holds when nothing rides: a step just ran.
        r.urgent = false;
        r.size_active = false;
        r.last_end = Instant::now();
        r.last_len = Duration::from_secs(60);
        assert!(!r.step_between_batches(), "within 30% of the writer's time");
    }
}
