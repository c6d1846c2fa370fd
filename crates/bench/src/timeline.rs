//! Recording an overload run over time: a `Recorder` that files every event
//! under its phase and under the second it was due (by due time, so the
//! figures for a second describe the load offered in that second), and the
//! scraper that samples the relay's /metrics series on an interval.
//! Storage is fixed when the run starts: one slot per phase and per second.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use crate::driver::{Outcome, Recorder, Tally, TallyReport};
use crate::metrics;

/// Scrape points kept at most; later ones are dropped and counted.
const MAX_SCRAPE_POINTS: usize = 20_000;

/// Values of type `T` filed by phase and by second of a run: one slot per
/// phase and one per second, fixed when the run starts. A time past the end
/// lands in the last phase and the last second.
pub struct Phased<T> {
    t0: Instant,
    /// End of each phase, as an offset from `t0`.
    phase_ends: Vec<Duration>,
    inner: Mutex<(Vec<T>, Vec<T>)>,
}

impl<T: Default + Clone> Phased<T> {
    pub fn new(t0: Instant, phase_secs: &[f64]) -> Phased<T> {
        let mut end = Duration::ZERO;
        let phase_ends: Vec<Duration> = phase_secs
            .iter()
            .map(|s| {
                end += Duration::from_secs_f64(*s);
                end
            })
            .collect();
        let seconds = (end.as_secs_f64().ceil() as usize).max(1);
        let inner = (
            vec![T::default(); phase_ends.len()],
            vec![T::default(); seconds],
        );
        Phased {
            t0,
            phase_ends,
            inner: Mutex::new(inner),
        }
    }

    fn slots(&self, at: Instant) -> (usize, usize) {
        let at = at.saturating_duration_since(self.t0);
        let phase = self.phase_ends.iter().position(|end| at < *end);
        let phase = phase.unwrap_or(self.phase_ends.len().saturating_sub(1));
        (phase, at.as_secs() as usize)
    }

    /// Applies `f` to the slot of the phase and of the second holding `at`.
    pub fn with(&self, at: Instant, f: impl Fn(&mut T)) {
        let (phase, second) = self.slots(at);
        let mut g = self.inner.lock().expect("phased lock");
        if let Some(t) = g.0.get_mut(phase) {
            f(t);
        }
        let last = g.1.len() - 1;
        f(&mut g.1[second.min(last)]);
    }

    /// A copy of the per-phase slots.
    pub fn phases(&self) -> Vec<T> {
        self.inner.lock().expect("phased lock").0.clone()
    }

    /// A view of every per-second slot.
    pub fn seconds<U>(&self, f: impl Fn(&T) -> U) -> Vec<U> {
        self.inner
            .lock()
            .expect("phased lock")
            .1
            .iter()
            .map(f)
            .collect()
    }
}

/// A per-second point of the timeline, as written to JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct SecondPoint {
    pub offered: u64,
    pub accepted: u64,
    /// Of `accepted`, those the relay already had (`duplicate:`).
    #[serde(default)]
    pub duplicates: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub skipped: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Files outcomes by phase and by second for one client class.
pub struct PhasedRecorder {
    slots: Phased<Tally>,
}

impl PhasedRecorder {
    pub fn new(t0: Instant, phase_secs: &[f64]) -> PhasedRecorder {
        PhasedRecorder {
            slots: Phased::new(t0, phase_secs),
        }
    }

    fn with(&self, due: Instant, f: impl Fn(&mut Tally)) {
        self.slots.with(due, f);
    }

    pub fn phase_reports(&self, phase_secs: &[f64]) -> Vec<TallyReport> {
        self.slots
            .phases()
            .iter()
            .zip(phase_secs)
            .map(|(t, secs)| t.report(*secs))
            .collect()
    }

    pub fn seconds(&self) -> Vec<SecondPoint> {
        self.slots.seconds(|t| SecondPoint {
            offered: t.sent + t.skipped,
            accepted: t.accepted,
            duplicates: t.duplicates,
            refused: t.refused,
            timeouts: t.timeouts,
            skipped: t.skipped,
            p50_ms: t.accepted_latency.percentile(0.5) as f64 / 1000.0,
            p99_ms: t.accepted_latency.percentile(0.99) as f64 / 1000.0,
        })
    }
}

impl Recorder for PhasedRecorder {
    fn sent(&self, due: Instant) {
        self.with(due, |t| t.sent += 1);
    }
    fn skipped(&self, due: Instant) {
        self.with(due, |t| t.skipped += 1);
    }
    fn outcome(&self, due: Instant, outcome: Outcome<'_>) {
        self.with(due, |t| t.outcome(outcome));
    }
    fn connection_error(&self, reason: &str) {
        // A connection error has no due time: it is filed under the phase running now.
        self.with(Instant::now(), |t| {
            t.connection_errors += 1;
            t.connection_error_reasons.add_key(reason);
        });
    }
}

/// One scrape of the relay's /metrics.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ScrapePoint {
    /// Seconds since the start of the run.
    pub t: f64,
    pub values: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Scrapes {
    pub url: String,
    /// Series kept: those whose names start with one of these.
    pub prefixes: Vec<String>,
    pub points: Vec<ScrapePoint>,
    pub failures: u64,
    pub last_error: Option<String>,
    pub dropped: u64,
}

/// What to sample during a run: the relay's /metrics page, its process, or both.
#[derive(Debug, Clone, Default)]
pub struct ScrapeTarget {
    pub url: Option<String>,
    /// Series kept from the page: those whose names start with one of these.
    pub prefixes: Vec<String>,
    /// A process whose /proc status is sampled too (for relays without /metrics).
    pub pid: Option<u32>,
}

/// Samples `target` every `every` until `stop` turns true.
pub async fn scrape_loop(
    target: ScrapeTarget,
    t0: Instant,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> Scrapes {
    let mut out = Scrapes {
        url: target.url.clone().unwrap_or_default(),
        prefixes: target.prefixes.clone(),
        ..Scrapes::default()
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => scrape_once(&target, &mut out, t0).await,
            _ = stop.changed() => break,
        }
    }
    scrape_once(&target, &mut out, t0).await;
    out
}

async fn scrape_once(target: &ScrapeTarget, out: &mut Scrapes, t0: Instant) {
    let now = Instant::now();
    let t = now.saturating_duration_since(t0).as_secs_f64()
        - t0.saturating_duration_since(now).as_secs_f64();
    let mut values = BTreeMap::new();
    if let Some(url) = &target.url {
        match metrics::http_get(url).await {
            Ok(text) => values.extend(
                metrics::parse_prometheus(&text)
                    .into_iter()
                    .filter(|s| {
                        target
                            .prefixes
                            .iter()
                            .any(|p| s.name.starts_with(p.as_str()))
                    })
                    .map(|s| (s.series, s.value)),
            ),
            Err(e) => out.fail(&e),
        }
    }
    if let Some(pid) = target.pid {
        match metrics::proc_memory(pid) {
            Ok(m) => {
                values.insert("proc_rss_bytes".into(), m.rss_bytes as f64);
                if let Some(anon) = m.rss_anon_bytes {
                    values.insert("proc_rss_anon_bytes".into(), anon as f64);
                }
            }
            Err(e) => out.fail(&e),
        }
    }
    if out.points.len() < MAX_SCRAPE_POINTS {
        out.points.push(ScrapePoint { t, values });
    } else {
        out.dropped += 1;
    }
}

impl Scrapes {
    fn fail(&mut self, e: &anyhow::Error) {
        self.failures += 1;
        self.last_error = Some(format!("{e:#}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_land_in_their_phase_and_second() {
        let t0 = Instant::now();
        let r = PhasedRecorder::new(t0, &[2.0, 3.0]);
        r.sent(t0 + Duration::from_millis(500));
        r.sent(t0 + Duration::from_millis(2500));
        let lat = Duration::from_millis(7);
        r.outcome(
            t0 + Duration::from_millis(2500),
            Outcome::Accepted {
                latency: lat,
                message: "",
            },
        );
        r.outcome(t0 + Duration::from_secs(60), Outcome::Timeout); // past the end: last phase
        let phases = r.phase_reports(&[2.0, 3.0]);
        assert_eq!((phases[0].sent, phases[1].sent), (1, 1));
        assert_eq!((phases[1].accepted, phases[1].timeouts), (1, 1));
        let secs = r.seconds();
        assert_eq!(secs.len(), 5);
        assert_eq!(
            (secs[0].offered, secs[2].offered, secs[2].accepted),
            (1, 1, 1)
        );
        assert_eq!(secs[2].p50_ms, 7.0);
    }
}
