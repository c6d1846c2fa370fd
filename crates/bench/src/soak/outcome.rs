//! The run's outcome: both classes' tallies summed into the `Summary`, and
//! the verdict over it and the end checks.

use super::ledger::ClassTally;
use super::report::{Checks, Summary, Verdict};
use super::summary::{SoakSample, refusal_split, sample_stats};
use crate::driver::Tally;

pub(super) fn summarize(
    w: &ClassTally,
    p: &ClassTally,
    ingest_secs: f64,
    samples: &[SoakSample],
    target_mb: Option<f64>,
) -> Summary {
    let mut all = Tally::default();
    all.merge(&w.tally);
    all.merge(&p.tally);
    let (rate_limited, error_answers, blocked, other_refused) =
        refusal_split(&all.refused_prefixes);
    // Offered: sent. Only events due after `--max-secs` are skipped (the
    // driver counts them), and those were never offered.
    let offered = all.sent;
    let accepted_bytes = w.accepted_bytes + p.accepted_bytes;
    let per_sec = |x: f64| {
        if ingest_secs > 0.0 {
            x / ingest_secs
        } else {
            0.0
        }
    };
    let polite_offered = p.tally.sent;
    Summary {
        ingest_secs,
        offered_events: offered,
        offered_bytes: w.offered_bytes + p.offered_bytes,
        accepted_events: all.accepted,
        accepted_bytes,
        duplicates: all.duplicates,
        acceptance: ratio(all.accepted, offered),
        accepted_per_sec: per_sec(all.accepted as f64),
        accepted_mib_per_sec: per_sec(accepted_bytes as f64 / (1024.0 * 1024.0)),
        refused: all.refused,
        rate_limited,
        error_answers,
        blocked,
        other_refused,
        timeouts: all.timeouts,
        lost: all.lost,
        connection_errors: all.connection_errors,
        refused_by_prefix: all.refused_prefixes.clone(),
        refusal_examples: all.examples.clone(),
        polite_offered,
        polite_accepted: p.tally.accepted,
        polite_success: ratio(p.tally.accepted, polite_offered),
        polite_ok: p.tally.accepted_latency.summary(),
        target_bytes: target_mb.map(|m| m * 1024.0 * 1024.0),
        samples: sample_stats(samples),
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Pass: no `error:` answer, something accepted, and both checks found everything.
pub fn verdict(s: &Summary, checks: &Checks) -> Verdict {
    let mut reasons = Vec::new();
    if s.error_answers > 0 {
        reasons.push(format!("{} error: answers", s.error_answers));
    }
    if s.accepted_events == 0 {
        reasons.push("no event accepted".to_owned());
    }
    for (name, c) in [("newest", &checks.newest), ("exempt", &checks.exempt)] {
        if c.missing > 0 {
            reasons.push(format!("{name}: {} accepted events missing", c.missing));
        }
        if c.unchecked > 0 {
            reasons.push(format!(
                "{name}: {} events could not be checked",
                c.unchecked
            ));
        }
    }
    Verdict {
        pass: reasons.is_empty(),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::check::StoredCheck;

    #[test]
    fn verdict_fails_on_errors_and_missing_events() {
        let w = ClassTally::default();
        let mut s = summarize(&w, &w, 1.0, &[], None);
        let ok = StoredCheck {
            expected: 3,
            found: 3,
            ..StoredCheck::default()
        };
        let checks = Checks {
            newest: ok.clone(),
            exempt: ok.clone(),
        };
        assert_eq!(verdict(&s, &checks).reasons, vec!["no event accepted"]);
        s.accepted_events = 10;
        assert!(verdict(&s, &checks).pass);
        s.error_answers = 2;
        let bad = Checks {
            newest: StoredCheck {
                missing: 1,
                ..ok.clone()
            },
            exempt: StoredCheck { unchecked: 4, ..ok },
        };
        let v = verdict(&s, &bad);
        assert!(!v.pass);
        assert_eq!(v.reasons.len(), 3, "{:?}", v.reasons);
    }
}
