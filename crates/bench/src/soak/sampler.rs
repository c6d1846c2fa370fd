//! The sampler: every `--sample-ms` it takes both classes' counts for the
//! interval and the relay's series from /metrics into a `SoakSample`, and
//! prints a progress line now and then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::generator::Produced;
use super::ledger::{ClassTally, SoakRecorder};
use super::mix::Budget;
use super::report::ScrapeStatus;
use super::summary::{
    self, RelayFigures, SoakSample, derive_rates, mib, refusal_split, relay_figures,
};
use crate::metrics;

/// Samples kept at most; later ones are dropped and counted.
const MAX_SAMPLES: usize = 500_000;

pub(super) struct Sampler {
    pub(super) t0: Instant,
    pub(super) every: Duration,
    pub(super) writers: Arc<SoakRecorder>,
    pub(super) polite: Arc<SoakRecorder>,
    pub(super) metrics_url: Option<String>,
    pub(super) progress_secs: u64,
    pub(super) budget: Budget,
    pub(super) produced: Arc<Produced>,
}

/// A sample from the interval's counts of both classes.
fn sample_of(t: f64, w: &ClassTally, p: &ClassTally, relay: RelayFigures) -> SoakSample {
    let mut prefixes = w.tally.refused_prefixes.clone();
    prefixes.merge(&p.tally.refused_prefixes);
    let (rate_limited, error, blocked, other_refused) = refusal_split(&prefixes);
    let (wt, pt) = (&w.tally, &p.tally);
    let lat = |q: f64| {
        (pt.accepted_latency.count() > 0).then(|| pt.accepted_latency.percentile(q) as f64 / 1e3)
    };
    SoakSample {
        t,
        sent: wt.sent + pt.sent,
        accepted: wt.accepted + pt.accepted,
        accepted_bytes: w.accepted_bytes + p.accepted_bytes,
        refused: wt.refused + pt.refused,
        rate_limited,
        error,
        blocked,
        other_refused,
        timeouts: wt.timeouts + pt.timeouts,
        lost: wt.lost + pt.lost,
        polite_sent: pt.sent,
        polite_accepted: pt.accepted,
        polite_answered: pt.accepted + pt.refused + pt.timeouts + pt.lost,
        polite_p50_ms: lat(0.5),
        polite_p99_ms: lat(0.99),
        relay,
        deletions_per_sec: None,
        retention_share: None,
    }
}

impl Sampler {
    pub(super) async fn run(
        self,
        mut stop: watch::Receiver<bool>,
    ) -> (Vec<SoakSample>, u64, ScrapeStatus) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut status = ScrapeStatus {
            url: self.metrics_url.clone(),
            ..ScrapeStatus::default()
        };
        let (mut samples, mut dropped) = (Vec::new(), 0u64);
        let mut last_progress = 0u64;
        loop {
            let last = tokio::select! {
                _ = tick.tick() => false,
                _ = stop.changed() => true,
            };
            let t = self.t0.elapsed().as_secs_f64();
            let (w, p) = (self.writers.take_sample(), self.polite.take_sample());
            let relay = self.scrape(&mut status).await;
            let s = sample_of(t, &w, &p, relay);
            if samples.len() < MAX_SAMPLES {
                samples.push(s);
            } else {
                dropped += 1;
            }
            let secs = t as u64;
            if self.progress_secs > 0 && secs >= last_progress + self.progress_secs && !last {
                last_progress = secs;
                self.print_progress(t, &mut samples);
            }
            if last {
                return (samples, dropped, status);
            }
        }
    }

    async fn scrape(&self, status: &mut ScrapeStatus) -> RelayFigures {
        let Some(url) = &self.metrics_url else {
            return RelayFigures::default();
        };
        status.scrapes += 1;
        match metrics::http_get(url).await {
            Ok(page) => {
                let f = relay_figures(&page);
                for (name, v) in [
                    (summary::STORE_USED_BYTES, f.store_used_bytes),
                    (summary::STORE_FILE_BYTES, f.store_file_bytes),
                    (summary::STORE_EVENTS, f.store_events),
                    (summary::RETENTION_DELETED_TOTAL, f.retention_deleted_total),
                    (summary::RETENTION_SECONDS_TOTAL, f.retention_seconds_total),
                ] {
                    if v.is_some() && !status.series_seen.iter().any(|s| s == name) {
                        status.series_seen.push(name.to_owned());
                    }
                }
                f
            }
            Err(e) => {
                status.failures += 1;
                status.last_error = Some(format!("{e:#}"));
                RelayFigures::default()
            }
        }
    }

    fn print_progress(&self, t: f64, samples: &mut [SoakSample]) {
        let (w, p) = (self.writers.total(), self.polite.total());
        let accepted = w.tally.accepted + p.tally.accepted;
        let answered = accepted
            + w.tally.refused
            + p.tally.refused
            + w.tally.timeouts
            + p.tally.timeouts
            + w.tally.lost
            + p.tally.lost;
        let mut line = format!(
            "[{t:6.0} s] {:4.1}% generated; accepted {accepted} ({:.1}%), {}",
            100.0 * self.produced.progress(&self.budget),
            100.0 * accepted as f64 / answered.max(1) as f64,
            mib((w.accepted_bytes + p.accepted_bytes) as f64),
        );
        derive_rates(samples);
        let recent = &samples[samples.len().saturating_sub(10)..];
        if let Some(used) = recent.iter().rev().find_map(|s| s.relay.store_used_bytes) {
            line += &format!("; store used {}", mib(used));
        }
        if let Some(d) = summary::median(
            &recent
                .iter()
                .filter_map(|s| s.deletions_per_sec)
                .collect::<Vec<_>>(),
        ) {
            line += &format!(", deleting {d:.0}/s");
        }
        let worst = recent
            .iter()
            .filter_map(|s| s.polite_p99_ms)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        if let Some(p99) = worst {
            line += &format!("; polite p99 {p99:.1} ms");
        }
        eprintln!("{line}");
    }
}
