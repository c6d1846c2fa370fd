//! Where publishers take their events from, and when each one is due.
//!
//! A `Source` hands out pre-signed events in sequence, each with its sequence
//! number, to any number of connections. It is either an in-memory pool
//! (wrapping around when exhausted: the wrapped events are duplicates, and the
//! caller reports how many) or a bounded channel fed by a producer thread: a
//! JSONL file read line by line, so a large file never sits in memory whole,
//! or events signed while the run goes on (`soak`).
//!
//! A `Schedule` maps a sequence number to its due time for open-loop load
//! (phases of fixed rate, back to back), or is closed-loop (send when a window
//! slot frees). Latency is measured from the due time, never from the actual
//! send, so a stalled relay cannot hide its stall (no coordinated omission).

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{Mutex, mpsc};

use crate::wire::Prepared;

/// Events read ahead of the publishers when streaming a file.
const STREAM_AHEAD_EVENTS: usize = 4096;

pub enum Source {
    Pool {
        events: Arc<[Prepared]>,
        next: AtomicU64,
        limit: u64,
    },
    Stream {
        rx: Mutex<(u64, mpsc::Receiver<Prepared>)>,
    },
}

impl Source {
    /// A pool that hands out at most `limit` events, wrapping over `events`.
    pub fn pool(events: Vec<Prepared>, limit: u64) -> Source {
        Source::Pool {
            events: events.into(),
            next: AtomicU64::new(0),
            limit,
        }
    }

    /// Streams at most `limit` events of a JSONL file.
    pub fn file(path: &Path, limit: Option<u64>) -> anyhow::Result<Source> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // Who waits when this fills: the reader thread, until publishers catch up.
        let (tx, rx) = mpsc::channel(STREAM_AHEAD_EVENTS);
        let limit = limit.unwrap_or(u64::MAX);
        std::thread::spawn(move || read_lines(std::io::BufReader::new(file), limit, tx));
        Ok(Source::channel(rx))
    }

    /// Hands out what a producer sends on `rx` (for example events signed
    /// while the run goes on), until the producer drops its sender.
    pub fn channel(rx: mpsc::Receiver<Prepared>) -> Source {
        Source::Stream {
            rx: Mutex::new((0, rx)),
        }
    }

    /// The next event and its sequence number, or `None` when exhausted.
    pub async fn next(&self) -> Option<(u64, Prepared)> {
        match self {
            Source::Pool {
                events,
                next,
                limit,
            } => {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= *limit || events.is_empty() {
                    return None;
                }
                Some((seq, events[(seq % events.len() as u64) as usize].clone()))
            }
            Source::Stream { rx } => {
                let mut guard = rx.lock().await;
                let ev = guard.1.recv().await?;
                let seq = guard.0;
                guard.0 += 1;
                Some((seq, ev))
            }
        }
    }
}

fn read_lines(reader: impl BufRead, limit: u64, tx: mpsc::Sender<Prepared>) {
    let lines = reader
        .lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty());
    for line in lines.take(limit as usize) {
        let Ok(p) = Prepared::from_raw(&line) else {
            eprintln!("skipping a line without a readable event id");
            continue;
        };
        if tx.blocking_send(p).is_err() {
            return; // the publishers stopped
        }
    }
}

/// A stretch of open-loop load at a fixed rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Events per second for this stretch (may be 0).
    pub rate: f64,
    /// Length in seconds (may be infinite for "until the source runs out").
    pub secs: f64,
}

impl Phase {
    /// Events offered in this phase.
    pub fn events(&self) -> f64 {
        if self.rate > 0.0 {
            (self.rate * self.secs).floor()
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// Send as soon as a window slot is free.
    ClosedLoop,
    /// Due times from back-to-back phases; sequence numbers past the last
    /// phase are not due at all (the run is over).
    Open(Vec<Phase>),
}

impl Schedule {
    /// When event `seq` is due, as an offset from the start of the run;
    /// `Some(ZERO)` always for closed loop, `None` past the end.
    pub fn due(&self, seq: u64) -> Option<Duration> {
        let Schedule::Open(phases) = self else {
            return Some(Duration::ZERO);
        };
        let (mut start_secs, mut first_seq) = (0.0f64, 0.0f64);
        let seq = seq as f64;
        for p in phases {
            let n = p.events();
            if seq < first_seq + n {
                return Some(Duration::from_secs_f64(
                    start_secs + (seq - first_seq) / p.rate,
                ));
            }
            start_secs += p.secs;
            first_seq += n;
        }
        None
    }

    /// How many events the schedule offers in all (`None`: unbounded or closed loop).
    pub fn total_events(&self) -> Option<u64> {
        let Schedule::Open(phases) = self else {
            return None;
        };
        let n: f64 = phases.iter().map(Phase::events).sum();
        n.is_finite().then_some(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_schedule_walks_the_phases() {
        let s = Schedule::Open(vec![
            Phase {
                rate: 10.0,
                secs: 1.0,
            },
            Phase {
                rate: 0.0,
                secs: 2.0,
            },
            Phase {
                rate: 100.0,
                secs: 1.0,
            },
        ]);
        assert_eq!(s.due(0), Some(Duration::ZERO));
        assert_eq!(s.due(5), Some(Duration::from_millis(500)));
        assert_eq!(s.due(10), Some(Duration::from_secs(3)));
        assert_eq!(s.due(60), Some(Duration::from_millis(3500)));
        assert_eq!(s.due(110), None);
        assert_eq!(s.total_events(), Some(110));
    }

    #[test]
    fn unbounded_phase_never_ends() {
        let s = Schedule::Open(vec![Phase {
            rate: 1000.0,
            secs: f64::INFINITY,
        }]);
        assert_eq!(s.due(1_000_000), Some(Duration::from_secs(1000)));
        assert_eq!(s.total_events(), None);
        assert_eq!(Schedule::ClosedLoop.due(7), Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn pool_wraps_and_stops_at_limit() {
        let raw = format!(r#"{{"id":"{}"}}"#, "01".repeat(32));
        let src = Source::pool(vec![Prepared::from_raw(&raw).unwrap()], 3);
        for want in 0..3 {
            assert_eq!(src.next().await.unwrap().0, want);
        }
        assert!(src.next().await.is_none());
    }
}
