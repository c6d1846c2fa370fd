//! What the terminal shows: the exempt authors as a configuration line,
//! the run's start, and the one-screen summary of a report.

use super::args::SoakArgs;
use super::mix::exempt_pubkeys;
use super::report::{Settings, SoakReport};
use super::summary::mib;

/// The exempt pubkeys as a line for the relay's configuration.
pub fn exempt_toml(pubkeys: &[String]) -> String {
    let quoted: Vec<String> = pubkeys.iter().map(|p| format!("\"{p}\"")).collect();
    format!("exempt_pubkeys = [{}]", quoted.join(", "))
}

/// `--print-exempt`.
pub fn print_exempt(args: &SoakArgs) {
    println!(
        "{}",
        exempt_toml(&exempt_pubkeys(args.seed, args.exempt_authors))
    );
}

pub(super) fn print_start(url: &str, s: &Settings, exempt: &[String]) {
    let budget = match (s.budget.bytes, s.budget.events) {
        (Some(b), Some(e)) => format!("{} or {e} events", mib(b as f64)),
        (Some(b), None) => mib(b as f64),
        (None, Some(e)) => format!("{e} events"),
        (None, None) => "?".into(),
    };
    println!(
        "soak: {url}: {budget} from {} authors over {} days, {} writers x {} in flight, {} polite every {} ms",
        s.authors, s.span_days, s.writers, s.window, s.polite, s.polite_interval_ms
    );
    if !exempt.is_empty() {
        println!(
            "  exempt authors (list them in the relay's retention.exempt_pubkeys):\n  {}",
            exempt_toml(exempt)
        );
    }
}

impl SoakReport {
    /// The one-screen summary.
    pub fn print(&self) {
        let (s, st) = (&self.summary, &self.summary.samples);
        let set = &self.settings;
        println!(
            "soak: {} {} writers x {}, {} polite every {} ms, {} authors ({} exempt), span {} days{}",
            self.run.relay.as_deref().unwrap_or("?"),
            set.writers,
            set.window,
            set.polite,
            set.polite_interval_ms,
            set.authors,
            set.exempt_authors,
            set.span_days,
            if self.stopped_early {
                " (stopped early)"
            } else {
                ""
            }
        );
        println!(
            "  ingested {} of {} events offered ({:.1}%), {} of {}, in {:.1} s ({:.0} events/s, {:.2} MiB/s)",
            s.accepted_events,
            s.offered_events,
            s.acceptance * 100.0,
            mib(s.accepted_bytes as f64),
            mib(s.offered_bytes as f64),
            s.ingest_secs,
            s.accepted_per_sec,
            s.accepted_mib_per_sec
        );
        let others: Vec<String> = s
            .refused_by_prefix
            .0
            .iter()
            .filter(|(k, _)| !["rate-limited", "error", "blocked"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let others = if others.is_empty() {
            String::new()
        } else {
            format!(" ({})", others.join(", "))
        };
        println!(
            "  refused: rate-limited {}, error {}, blocked {}, other {}{others}; timeouts {}, lost {}, connection errors {}",
            s.rate_limited,
            s.error_answers,
            s.blocked,
            s.other_refused,
            s.timeouts,
            s.lost,
            s.connection_errors
        );
        for m in self.summary.refusal_examples.0.values() {
            println!("    e.g. {m:?}");
        }
        let worst = match (st.polite_worst_p99_ms, st.polite_worst_p99_at_secs) {
            (Some(v), Some(t)) => format!(", worst sample p99 {v:.1} ms at {t:.0} s"),
            _ => String::new(),
        };
        println!(
            "  polite: {} of {} accepted ({:.1}%), OK p50 {:.1} ms, p99 {:.1} ms{worst}",
            s.polite_accepted,
            s.polite_offered,
            s.polite_success * 100.0,
            s.polite_ok.p50_ms,
            s.polite_ok.p99_ms
        );
        let target = s.target_bytes;
        let of_target = |v: f64| {
            target
                .map(|t| format!(" ({:.0}% of target)", 100.0 * v / t))
                .unwrap_or_default()
        };
        for (name, m) in [
            ("store used", &st.store_used_second_half),
            ("store file", &st.store_file_second_half),
        ] {
            match m {
                Some(m) => println!(
                    "  {name} (second half): min {}, median {}, max {}{}",
                    mib(m.min),
                    mib(m.median),
                    mib(m.max),
                    of_target(m.max)
                ),
                None => println!("  {name}: not reported by the relay"),
            }
        }
        if let Some(t) = target {
            println!("  store target: {}", mib(t));
        }
        if st.deletions_per_sec_median.is_none() && st.retention_share.is_none() {
            println!("  retention: no retention metrics from the relay");
        } else {
            let count = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.0}"));
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{:.1}%", x * 100.0));
            println!(
                "  retention: deleted {} events; deletions/s mean {}, median {} (second half {}); \
                 writer time in retention {} (worst sample {})",
                count(st.deleted_during_run),
                count(st.deletions_per_sec_mean),
                count(st.deletions_per_sec_median),
                count(st.deletions_per_sec_median_second_half),
                pct(st.retention_share),
                pct(st.retention_share_max_sample),
            );
        }
        println!("  check newest: {}", self.checks.newest.line());
        println!("  check exempt: {}", self.checks.exempt.line());
        for (name, c) in [
            ("newest", &self.checks.newest),
            ("exempt", &self.checks.exempt),
        ] {
            for id in &c.missing_examples {
                println!("    {name} missing: {id}");
            }
            for n in &c.notes {
                println!("    {name}: {n}");
            }
        }
        if self.metrics.failures > 0 {
            println!(
                "  metrics: {} of {} scrapes failed: {}",
                self.metrics.failures,
                self.metrics.scrapes,
                self.metrics.last_error.as_deref().unwrap_or("?")
            );
        }
        println!("  {}", self.run.cpu_line());
        if self.verdict.pass {
            println!("  verdict: PASS");
        } else {
            println!("  verdict: FAIL: {}", self.verdict.reasons.join("; "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exempt_keys_print_as_a_toml_line() {
        let keys = exempt_pubkeys(1, 2);
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().all(|k| k.len() == 64));
        let line = exempt_toml(&keys);
        assert_eq!(
            line,
            format!("exempt_pubkeys = [\"{}\", \"{}\"]", keys[0], keys[1])
        );
        assert_eq!(exempt_toml(&[]), "exempt_pubkeys = []");
    }
}
