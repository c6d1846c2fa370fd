//! The batcher: takes the parsed chunks back in input order, counts their
//! lines, batches their events and hands each batch to the engine's writer.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice_engine::Engine;
use sluice_engine::writer::BulkTicket;
use sluice_proto::Event;
use sluice_store::WriteOutcome;

use super::Plan;
use super::pacer::BulkPacer;
use super::parse::Item;
use super::report::{Live, Reporter, Sample, Summary};

/// A batch that has waited this long for more events is written anyway,
/// so a slow stream (a pipe) still commits regularly...
const FLUSH_AFTER: Duration = Duration::from_millis(250);
/// ...and one that keeps growing slowly is written at this age.
const MAX_BATCH_AGE: Duration = Duration::from_secs(5);

/// A chunk after the workers: its non-blank lines' verdicts, in order.
pub(super) struct Parsed {
    pub(super) seq: u64,
    pub(super) source: usize,
    pub(super) items: Vec<Item>,
    pub(super) blank: u64,
}

/// The batcher: in-order consumer, batcher and counter; the engine's
/// writer writes its batches.
pub(super) struct Batcher<'a> {
    plan: &'a Plan,
    engine: &'a Engine,
    limiter: &'a BulkPacer,
    reporter: &'a Reporter,
    live: &'a Live,
    pub(super) summary: Summary,
    batch: Vec<Event>,
    batch_bytes: usize,
    batch_started: Option<Instant>,
    /// Where the last event of the batch came from, for error messages.
    batch_last: (usize, u64),
    /// The batch the writer has, and where its last event came from: the
    /// next batch is built while it is written (two batches held at most).
    writing: Option<(BulkTicket, (usize, u64))>,
}

impl<'a> Batcher<'a> {
    pub(super) fn new(
        plan: &'a Plan,
        engine: &'a Engine,
        limiter: &'a BulkPacer,
        reporter: &'a Reporter,
        live: &'a Live,
    ) -> Self {
        Batcher {
            plan,
            engine,
            limiter,
            reporter,
            live,
            summary: Summary::default(),
            batch: Vec::with_capacity(plan.batch_events),
            batch_bytes: 0,
            batch_started: None,
            batch_last: (0, 0),
            writing: None,
        }
    }

    /// Batches every parsed chunk in order and waits for the writer.
    /// `parsed_all` is called once every chunk is taken, before the last
    /// batch waits for the one before it to commit: the parse threads are
    /// done, and a core is free for what follows the import (its search
    /// index, which reads what is committed) while the writer writes the
    /// last two batches.
    pub(super) fn run(
        &mut self,
        results: Receiver<Parsed>,
        tokens: Receiver<()>,
        parsed_all: &mut dyn FnMut(),
    ) -> anyhow::Result<()> {
        let mut next_seq = 0u64;
        // Chunks that arrived ahead of their turn; bounded by the tokens.
        let mut ahead: BTreeMap<u64, Parsed> = BTreeMap::new();
        loop {
            let parsed = match ahead.remove(&next_seq) {
                Some(p) => p,
                None => {
                    let got = match self.batch_started {
                        Some(t) => results.recv_timeout(
                            FLUSH_AFTER.min(MAX_BATCH_AGE.saturating_sub(t.elapsed())),
                        ),
                        None => results.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match got {
                        Ok(p) => {
                            ahead.insert(p.seq, p);
                            continue;
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            self.flush()?;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            // Every chunk sent was numbered without gaps.
                            if let Some(seq) = ahead.keys().next() {
                                bail!("internal error: chunk {next_seq} missing before {seq}");
                            }
                            break;
                        }
                    }
                }
            };
            next_seq += 1;
            // Its token goes back: the reader may read one more chunk.
            let _ = tokens.recv();
            self.engine.bulk_backlog().remove();
            if !self.take(parsed)? {
                break;
            }
        }
        parsed_all();
        self.flush()?;
        self.settle()
    }

    /// Counts one chunk's lines and batches its events. False when
    /// `--strict` must stop here.
    fn take(&mut self, parsed: Parsed) -> anyhow::Result<bool> {
        self.summary.blank_lines += parsed.blank;
        for item in parsed.items {
            self.summary.lines += 1;
            match item {
                Item::Event { line, event } => {
                    self.batch_bytes += event.raw().len();
                    self.batch.push(event);
                    self.batch_last = (parsed.source, line);
                    self.batch_started.get_or_insert_with(Instant::now);
                    if self.batch.len() >= self.limiter.batch_limit(self.plan.batch_events)
                        || self.batch_bytes >= self.plan.batch_bytes
                    {
                        self.flush()?;
                    }
                }
                Item::Expired => self.summary.expired += 1,
                Item::Bad {
                    line,
                    reason,
                    detail,
                } => {
                    let source = self.plan.sources[parsed.source].name();
                    let at = format!("{source}:{line}");
                    let printed = self.summary.refuse(Sample {
                        source,
                        line,
                        reason: reason.as_str(),
                        detail: detail.clone(),
                    });
                    self.live.refused.fetch_add(1, Ordering::Relaxed);
                    if printed {
                        self.reporter
                            .note(&format!("import: {at}: {}: {detail}", reason.as_str()));
                    }
                    if self.plan.strict {
                        self.summary.stopped_at = Some(format!("{at} ({})", reason.as_str()));
                        return Ok(false);
                    }
                }
            }
        }
        self.live.lines.store(self.summary.lines, Ordering::Relaxed);
        Ok(true)
    }

    /// Hands the batch to the engine's writer, to be written in one
    /// transaction (after the limiter's pause), once the batch before it is
    /// committed: the writer writes one batch while the next is built.
    fn flush(&mut self) -> anyhow::Result<()> {
        self.batch_started = None;
        if self.batch.is_empty() {
            return Ok(());
        }
        self.limiter
            .pause(self.batch.len() as f64 / self.plan.batch_events as f64);
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.plan.batch_events));
        self.batch_bytes = 0;
        self.settle()?;
        let ticket = self
            .engine
            .submit_batch_blocking(batch)
            .with_context(|| self.batch_error(self.batch_last))?;
        self.writing = Some((ticket, self.batch_last));
        Ok(())
    }

    fn batch_error(&self, (source, line): (usize, u64)) -> String {
        format!(
            "writing the batch ending at {}:{line} (re-run the same import to continue)",
            self.plan.sources[source].name()
        )
    }

    /// Waits for the batch the writer has, if any, and counts its outcomes.
    fn settle(&mut self) -> anyhow::Result<()> {
        let Some((ticket, last)) = self.writing.take() else {
            return Ok(());
        };
        let outcomes = ticket.wait().with_context(|| self.batch_error(last))?;
        let s = &mut self.summary;
        s.batches += 1;
        s.events += outcomes.len() as u64;
        for o in outcomes {
            match o {
                WriteOutcome::Stored {
                    replaced, deleted, ..
                } => {
                    s.stored += 1;
                    s.replaced += u64::from(replaced);
                    s.removed_by_deletions += u64::from(deleted);
                }
                WriteOutcome::Duplicate => s.duplicate += 1,
                WriteOutcome::Superseded => s.superseded += 1,
                WriteOutcome::Deleted => s.deleted += 1,
                WriteOutcome::Expired => s.expired += 1,
                WriteOutcome::Ephemeral => s.ephemeral += 1,
                WriteOutcome::OutsideRetention => s.outside_retention += 1,
                WriteOutcome::Vanished => s.vanished += 1,
            }
        }
        self.live.stored.store(s.stored, Ordering::Relaxed);
        Ok(())
    }
}
