//! Counting REQs: what became of each one (EOSE, CLOSED by message prefix,
//! timeout, lost with its connection, still open when the run ended), its
//! time to EOSE, and the events and bytes that came back. `ReadRecorder`
//! files these by phase and by second (see `timeline::Phased`); a REQ is
//! filed under the time it was due (polite) or sent (abusive), so the
//! figures of a second describe the REQs issued in it.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::stats::{Examples, Histogram, LatencySummary, PrefixCounts, per_sec};
use crate::timeline::Phased;

/// What became of one REQ.
#[derive(Debug, Clone, Copy)]
pub enum ReadOutcome<'a> {
    Eose {
        latency: Duration,
    },
    Closed {
        latency: Duration,
        message: &'a str,
    },
    /// No EOSE or CLOSED within the timeout.
    Timeout,
    /// The connection dropped before an answer.
    Lost,
    /// Still unanswered when its client stopped (abusers at the end of the flood).
    Unanswered,
}

/// Counts and latencies for a set of REQs.
#[derive(Debug, Clone, Default)]
pub struct ReadTally {
    pub sent: u64,
    /// Due but not sent (the connection was down until the run ended, or too many were open).
    pub skipped: u64,
    pub eose: u64,
    pub closed: u64,
    pub closed_prefixes: PrefixCounts,
    pub closed_examples: Examples,
    pub timeouts: u64,
    pub lost: u64,
    pub unanswered: u64,
    /// EVENT frames received.
    pub events: u64,
    /// Bytes of every text frame received (EVENTs and the rest).
    pub bytes: u64,
    pub eose_latency: Histogram,
    pub closed_latency: Histogram,
}

impl ReadTally {
    pub fn outcome(&mut self, outcome: ReadOutcome<'_>) {
        match outcome {
            ReadOutcome::Eose { latency } => {
                self.eose += 1;
                self.eose_latency.record(latency.as_micros() as u64);
            }
            ReadOutcome::Closed { latency, message } => {
                self.closed += 1;
                self.closed_latency.record(latency.as_micros() as u64);
                self.closed_prefixes.add(message);
                self.closed_examples.add(message);
            }
            ReadOutcome::Timeout => self.timeouts += 1,
            ReadOutcome::Lost => self.lost += 1,
            ReadOutcome::Unanswered => self.unanswered += 1,
        }
    }

    /// A JSON-ready view over `secs` seconds.
    pub fn report(&self, secs: f64) -> ReadReport {
        ReadReport {
            sent: self.sent,
            skipped: self.skipped,
            eose: self.eose,
            closed: self.closed,
            closed_prefixes: self.closed_prefixes.clone(),
            closed_examples: self.closed_examples.clone(),
            timeouts: self.timeouts,
            lost: self.lost,
            unanswered_at_end: self.unanswered,
            success_ratio: if self.sent == 0 {
                0.0
            } else {
                self.eose as f64 / self.sent as f64
            },
            sent_per_sec: per_sec(self.sent, secs),
            eose_per_sec: per_sec(self.eose, secs),
            time_to_eose: self.eose_latency.summary(),
            time_to_closed: self.closed_latency.summary(),
            events: self.events,
            bytes: self.bytes,
            events_per_sec: per_sec(self.events, secs),
            bytes_per_sec: per_sec(self.bytes, secs),
        }
    }

    fn second(&self) -> ReadSecond {
        ReadSecond {
            sent: self.sent,
            eose: self.eose,
            closed: self.closed,
            timeouts: self.timeouts,
            lost: self.lost,
            events: self.events,
            bytes: self.bytes,
            p50_ms: self.eose_latency.percentile(0.5) as f64 / 1000.0,
            p99_ms: self.eose_latency.percentile(0.99) as f64 / 1000.0,
        }
    }
}

/// REQ figures of one class in one phase, as written to JSON.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ReadReport {
    pub sent: u64,
    pub skipped: u64,
    pub eose: u64,
    pub closed: u64,
    pub closed_prefixes: PrefixCounts,
    /// The first full CLOSED message of each prefix.
    pub closed_examples: Examples,
    pub timeouts: u64,
    pub lost: u64,
    pub unanswered_at_end: u64,
    /// eose / sent.
    pub success_ratio: f64,
    pub sent_per_sec: f64,
    pub eose_per_sec: f64,
    pub time_to_eose: LatencySummary,
    pub time_to_closed: LatencySummary,
    pub events: u64,
    pub bytes: u64,
    pub events_per_sec: f64,
    pub bytes_per_sec: f64,
}

impl ReadReport {
    /// Prints the figures under `label`, the lines after the first indented to match.
    pub fn print(&self, indent: &str, label: &str) {
        let more = format!("{indent}{}", " ".repeat(label.chars().count()));
        println!(
            "{indent}{label}REQs sent {} ({:.1}/s), EOSE {} ({:.1}%), CLOSED {}, timeouts {}, lost {}, unanswered at end {}, skipped {}",
            self.sent,
            self.sent_per_sec,
            self.eose,
            self.success_ratio * 100.0,
            self.closed,
            self.timeouts,
            self.lost,
            self.unanswered_at_end,
            self.skipped
        );
        if self.eose > 0 {
            println!("{more}time to EOSE: {}", self.time_to_eose);
        }
        if self.closed > 0 {
            println!(
                "{more}CLOSED by prefix: {} (time to CLOSED p50 {:.2} ms, p99 {:.2} ms)",
                self.closed_prefixes, self.time_to_closed.p50_ms, self.time_to_closed.p99_ms
            );
            for m in self.closed_examples.0.values() {
                println!("{more}  e.g. {m:?}");
            }
        }
        println!(
            "{more}received {} events, {:.1} MB ({:.0} events/s, {:.1} MB/s)",
            self.events,
            self.bytes as f64 / 1e6,
            self.events_per_sec,
            self.bytes_per_sec / 1e6
        );
    }
}

/// REQ figures of one class in one second of the run.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ReadSecond {
    pub sent: u64,
    pub eose: u64,
    pub closed: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub events: u64,
    pub bytes: u64,
    /// Time to EOSE of the REQs of this second that got one (0 when none did).
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Files REQ outcomes by phase and by second for one client class.
pub struct ReadRecorder {
    slots: Phased<ReadTally>,
    phase_secs: Vec<f64>,
}

impl ReadRecorder {
    pub fn new(t0: Instant, phase_secs: &[f64]) -> ReadRecorder {
        ReadRecorder {
            slots: Phased::new(t0, phase_secs),
            phase_secs: phase_secs.to_vec(),
        }
    }

    pub fn sent(&self, due: Instant) {
        self.slots.with(due, |t| t.sent += 1);
    }

    pub fn skipped(&self, due: Instant) {
        self.slots.with(due, |t| t.skipped += 1);
    }

    pub fn outcome(&self, due: Instant, outcome: ReadOutcome<'_>) {
        self.slots.with(due, |t| t.outcome(outcome));
    }

    /// Events and bytes received, filed under `at`.
    pub fn received(&self, at: Instant, events: u64, bytes: u64) {
        if events > 0 || bytes > 0 {
            self.slots.with(at, |t| {
                t.events += events;
                t.bytes += bytes;
            });
        }
    }

    pub fn phase_reports(&self) -> Vec<ReadReport> {
        self.slots
            .phases()
            .iter()
            .zip(&self.phase_secs)
            .map(|(t, secs)| t.report(*secs))
            .collect()
    }

    pub fn seconds(&self) -> Vec<ReadSecond> {
        self.slots.seconds(ReadTally::second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_filed_and_reported() {
        let t0 = Instant::now();
        let r = ReadRecorder::new(t0, &[1.0, 2.0]);
        let at = |ms| t0 + Duration::from_millis(ms);
        r.sent(at(100));
        r.sent(at(1500));
        r.sent(at(1600));
        r.outcome(
            at(100),
            ReadOutcome::Eose {
                latency: Duration::from_millis(4),
            },
        );
        r.outcome(
            at(1500),
            ReadOutcome::Closed {
                latency: Duration::from_millis(1),
                message: "rate-limited: slow down",
            },
        );
        r.outcome(at(1600), ReadOutcome::Timeout);
        r.received(at(1700), 10, 5000);
        let p = r.phase_reports();
        assert_eq!((p[0].sent, p[0].eose, p[0].success_ratio), (1, 1, 1.0));
        assert_eq!((p[1].sent, p[1].closed, p[1].timeouts), (2, 1, 1));
        assert_eq!(p[1].closed_prefixes.0["rate-limited"], 1);
        assert_eq!(
            (p[1].events, p[1].bytes, p[1].bytes_per_sec),
            (10, 5000, 2500.0)
        );
        assert_eq!(p[0].time_to_eose.p50_ms, 4.0);
        let s = r.seconds();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].eose, s[1].sent, s[1].events), (1, 2, 10));
        assert_eq!(s[0].p99_ms, 4.0);
    }
}
