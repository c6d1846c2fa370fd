//! What each rule would remove now, removing nothing.

use std::time::Duration;

use sluice_store::{Scan, Scope, Store, StoreError};

use super::plan::RetentionPlan;

/// What each rule would remove now (`sluice retention --dry-run`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRun {
    /// Per rule, in order: events its age limit would remove, events its
    /// per-author count would remove.
    pub rules: Vec<(u64, u64)>,
    /// Used bytes, the size target (0: none) and, when over it, about how
    /// many events size eviction would remove.
    pub used_bytes: u64,
    pub target_bytes: u64,
    pub size_events: u64,
}

impl RetentionPlan {
    /// Counts, without removing anything, what each rule would remove now.
    /// Reads the store in short read transactions.
    pub fn dry_run(&self, store: &Store, now_unix: u64) -> Result<DryRun, StoreError> {
        const STEP: usize = 10_000;
        let ret = self.retention();
        let mut out = DryRun {
            used_bytes: store.used_bytes()?,
            target_bytes: self.target_bytes,
            ..DryRun::default()
        };
        for rule in &ret.rules {
            let mut aged = 0u64;
            if let Some(cutoff) = rule.age_cutoff(now_unix) {
                let scope = Scope::of_kinds(&rule.kinds);
                let mut after = None;
                loop {
                    let p = store.pick_oldest(&Scan {
                        scope: &scope,
                        before: cutoff,
                        after,
                        replaceable: !rule.kinds.is_empty(),
                        exempt: &ret.exempt,
                        max_pick: STEP,
                        max_examine: STEP,
                        max_time: Duration::MAX,
                    })?;
                    aged += p.serials.len() as u64;
                    match p.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
            }
            let mut counted = 0u64;
            if let Some(keep) = rule.keep_per_author {
                let mut cursor: Option<[u8; 32]> = None;
                loop {
                    let authors = store.authors_after(cursor.as_ref(), 1024)?;
                    let Some(last) = authors.last() else { break };
                    cursor = Some(*last);
                    for a in authors.iter().filter(|a| !ret.exempt.contains(*a)) {
                        let (picked, _) =
                            store.pick_author_excess(a, &rule.kinds, keep, usize::MAX / 2)?;
                        counted += picked.len() as u64;
                    }
                }
            }
            out.rules.push((aged, counted));
        }
        if self.target_bytes > 0 && out.used_bytes > self.target_bytes {
            let stats = store.stats()?;
            let per_event = (out.used_bytes / stats.events.max(1)).max(1);
            let mut want = (out.used_bytes - self.low_bytes) / per_event;
            for scope in self.size_phases() {
                let mut after = None;
                while want > 0 {
                    let p = store.pick_oldest(&Scan {
                        scope: &scope,
                        before: u64::MAX,
                        after,
                        replaceable: false,
                        exempt: &ret.exempt,
                        max_pick: STEP.min(want as usize),
                        max_examine: STEP,
                        max_time: Duration::MAX,
                    })?;
                    out.size_events += p.serials.len() as u64;
                    want -= (p.serials.len() as u64).min(want);
                    match p.next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
            }
        }
        Ok(out)
    }
}
