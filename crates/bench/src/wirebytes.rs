//! `wire`: the bytes that cross the socket per served event, with a client
//! that offers permessage-deflate (RFC 7692), so that relays that compress
//! (strfry, with its sliding window) and relays that do not can be compared.
//!
//! The run takes `--count` events from a JSONL file (after `--skip`) and:
//!
//! 1. Live: `--subscribers` raw connections (`wsraw`) each send one REQ per
//!    `--ids-per-req` ids of those events and wait for every EOSE (nothing
//!    is stored yet, so each answer is a bare EOSE). One plain connection
//!    then publishes the events (`--window` in flight, counting OKs); the
//!    EVENT frames each subscriber reads after its EOSEs, over the events
//!    it received, are the bytes per live event. The filters name ids
//!    rather than `since`: real events carry their old `created_at`.
//! 2. Stored: `--repeat` times, a fresh raw connection asks for the accepted
//!    events by id, one REQ at a time (`--ids-per-req` ids, `limit` the
//!    same: strfry's `maxFilterLimit` is 500), closing each after its EOSE;
//!    the frames of each REQ's EVENTs and EOSE, over the events received,
//!    are the bytes per stored event. The median round is reported.
//!
//! Frames are counted whole (headers included) as read; other messages
//! (an AUTH challenge, a NOTICE) are reported apart, not in the figures.
//!
//! One publish serves both phases, so the events must be new to the relay:
//! run it on a fresh store (or `--skip` past events it already holds).
//! Duplicates are accepted but not delivered live; the report counts them.
//!
//! With `--relay-pid`, the relay's CPU (utime + stime) over each phase is
//! divided by the events it served there. The live phase includes the
//! ingest of each event (verifying, storing), so compare its figure across
//! runs with and without compression on fresh stores, or raise
//! `--subscribers` to spread the ingest over more deliveries.

mod figures;
mod phases;

pub use figures::{
    Bytes, HandshakeSeen, LiveFigures, PerEvent, PublishFigures, StoredFigures, StoredRound, median,
};

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use serde::Serialize;

use crate::metrics;
use crate::report::RunInfo;
use crate::wire::{Prepared, RelayUrl};
use crate::wsraw;

#[derive(Debug, Clone, clap::Args)]
pub struct WireArgs {
    pub relay: String,
    /// JSONL of signed events, one per line.
    #[arg(long)]
    pub events: PathBuf,
    /// Events to use.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Lines of the file passed over first (events the relay already holds).
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Offer permessage-deflate (the default).
    #[arg(long, overrides_with = "no_deflate")]
    pub deflate: bool,
    /// Offer no extension: the uncompressed baseline.
    #[arg(long, overrides_with = "deflate")]
    pub no_deflate: bool,
    /// Also compress the REQs this client sends, when the relay agreed.
    #[arg(long)]
    pub compress_requests: bool,
    /// Live subscribers, each holding the same subscriptions.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    /// Stored rounds, each on a fresh connection; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Ids per REQ (its one filter's `ids` and `limit`).
    #[arg(long, default_value_t = 500)]
    pub ids_per_req: usize,
    /// EVENTs in flight while publishing.
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Longest wait for an OK or an EOSE, and for the next live event once
    /// publishing is done.
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
    /// The relay's process id: its CPU time is read from /proc/PID/stat.
    #[arg(long)]
    pub relay_pid: Option<u32>,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl WireArgs {
    fn plan(&self) -> phases::Plan {
        phases::Plan {
            opts: wsraw::Options {
                offer_deflate: !self.no_deflate,
                compress_sends: self.compress_requests,
                ..wsraw::Options::default()
            },
            subscribers: self.subscribers,
            ids_per_req: self.ids_per_req,
            window: self.window,
            repeat: self.repeat,
            timeout: Duration::from_millis(self.timeout_ms),
        }
    }
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct WireReport {
    pub run: RunInfo,
    pub events_file: String,
    pub skip: usize,
    /// Events read from the file.
    pub events: usize,
    pub offer_deflate: bool,
    pub compress_requests: bool,
    /// The relay's `Sec-WebSocket-Extensions` answer; `None`: no extension.
    pub extension: Option<String>,
    /// Upgrade request and 101 answer of one connection.
    pub handshake_bytes_sent: u64,
    pub handshake_bytes_received: u64,
    pub relay_pid: Option<u32>,
    pub publish: PublishFigures,
    pub live: LiveFigures,
    pub stored: StoredFigures,
}

/// Lines `skip..skip + count` of a JSONL file (blank lines not counted).
pub fn read_events(path: &Path, skip: usize, count: usize) -> anyhow::Result<Vec<Prepared>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .skip(skip)
        .take(count)
        .map(|(i, l)| {
            Prepared::from_raw(l).with_context(|| format!("{} line {}", path.display(), i + 1))
        })
        .collect()
}

pub async fn run(args: &WireArgs) -> anyhow::Result<WireReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let mut run = RunInfo::new("wire", Some(&args.relay));
    ensure!(args.ids_per_req > 0, "--ids-per-req must be at least 1");
    ensure!(args.subscribers > 0, "--subscribers must be at least 1");
    if let Some(pid) = args.relay_pid {
        metrics::proc_cpu_secs(pid).with_context(|| format!("--relay-pid {pid}"))?;
    }
    let events = read_events(&args.events, args.skip, args.count)?;
    ensure!(!events.is_empty(), "no events in {}", args.events.display());
    let cpu = || args.relay_pid.and_then(|p| metrics::proc_cpu_secs(p).ok());

    let plan = args.plan();
    let live = phases::Live::subscribe(&relay, &plan, &events).await?;
    let handshake = live.handshake();
    let (publish, accepted_ids, live) = live
        .publish_and_receive(&relay, &plan, &events, cpu)
        .await?;
    if publish.duplicates > 0 {
        eprintln!(
            "wire: {} events were already stored and are not delivered live: \
             use a fresh store or --skip",
            publish.duplicates
        );
    }
    let stored = phases::stored(&relay, &plan, &accepted_ids, cpu).await?;
    run.finish();
    Ok(WireReport {
        run,
        events_file: args.events.display().to_string(),
        skip: args.skip,
        events: events.len(),
        offer_deflate: !args.no_deflate,
        compress_requests: args.compress_requests,
        extension: handshake.extensions,
        handshake_bytes_sent: handshake.sent,
        handshake_bytes_received: handshake.received,
        relay_pid: args.relay_pid,
        publish,
        live,
        stored,
    })
}

impl WireReport {
    pub fn print(&self) {
        println!(
            "wire: {} {} events from {} (skip {}), permessage-deflate {}",
            self.run.relay.as_deref().unwrap_or("?"),
            self.events,
            self.events_file,
            self.skip,
            if self.offer_deflate {
                "offered"
            } else {
                "not offered"
            },
        );
        println!(
            "  extension agreed: {}; handshake {} B sent, {} B received",
            self.extension.as_deref().unwrap_or("none"),
            self.handshake_bytes_sent,
            self.handshake_bytes_received
        );
        let p = &self.publish;
        println!(
            "  publish: {} sent, {} accepted ({} duplicates), {} refused ({}), {} timeouts, {:.2} s",
            p.sent, p.accepted, p.duplicates, p.refused, p.refused_prefixes, p.timeouts, p.secs
        );
        let cpu =
            |us: Option<f64>| us.map_or(String::new(), |v| format!(", relay CPU {v:.0} µs/event"));
        let l = &self.live;
        println!(
            "  live: {} subscriber(s) x {} REQs, {} events of {} expected; {}{}",
            l.subscribers,
            l.reqs,
            l.received.events,
            l.expected_per_subscriber * l.subscribers as u64,
            bytes_line(&l.per_event),
            cpu(l.relay_cpu_us_per_event)
        );
        if l.closed.total() > 0 {
            println!("    CLOSED: {}", l.closed);
        }
        print_other(&l.other);
        let s = &self.stored;
        let counts: Vec<String> = s
            .rounds
            .iter()
            .map(|r| r.received.events.to_string())
            .collect();
        println!(
            "  stored: {} rounds x {} REQs, {} of {} events each; median {}{}",
            s.rounds.len(),
            s.reqs_per_round,
            counts.join("/"),
            s.requested,
            bytes_line(&s.per_event),
            cpu(s.relay_cpu_us_per_event)
        );
        if let Some(r) = s.rounds.first() {
            println!("    a round sent {} B of REQs and CLOSEs", r.sent_bytes);
            if r.closed.total() > 0 {
                println!("    CLOSED: {}", r.closed);
            }
            print_other(&r.other);
        }
        println!("  {}", self.run.cpu_line());
    }
}

fn print_other(other: &Bytes) {
    if other.messages > 0 {
        println!(
            "    not counted: {} other message(s), {} B on the wire",
            other.messages, other.wire
        );
    }
}

fn bytes_line(p: &PerEvent) -> String {
    format!(
        "{:.1} B/event on the wire, {:.1} B uncompressed ({:.1} payload), ratio {:.3}",
        p.wire,
        p.plain_wire,
        p.payload,
        p.wire / p.plain_wire.max(1.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wsraw::codec::MsgSize;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn events_are_read_after_the_skip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        let line = |i: u8| format!(r#"{{"id":"{}","kind":1}}"#, hex::encode([i; 32]));
        std::fs::write(&path, format!("{}\n\n{}\n{}\n", line(1), line(2), line(3))).unwrap();
        let ids: Vec<u8> = read_events(&path, 1, 5)
            .unwrap()
            .iter()
            .map(|p| p.id[0])
            .collect();
        assert_eq!(ids, [2, 3]);
        std::fs::write(&path, "not json\n").unwrap();
        assert!(read_events(&path, 0, 1).is_err());
    }

    #[test]
    fn ids_go_in_filters_of_at_most_the_chunk() {
        let ids: Vec<[u8; 32]> = (0..1001u32).map(|i| [(i % 256) as u8; 32]).collect();
        let filters = phases::id_filters(&ids, 500);
        let sizes: Vec<(usize, u64)> = filters
            .iter()
            .map(|f| {
                (
                    f["ids"].as_array().unwrap().len(),
                    f["limit"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(sizes, [(500, 500), (500, 500), (1, 1)]);
        assert_eq!(filters[0]["ids"][1], hex::encode([1u8; 32]));
    }

    #[test]
    fn bytes_per_event() {
        let mut t = Bytes::default();
        for (wire, payload, compressed) in [(100, 300, true), (200, 300, true), (127, 125, false)] {
            t.add_msg(&MsgSize {
                wire,
                payload,
                compressed,
            });
        }
        t.events = 2;
        let p = t.per_event();
        assert_eq!((p.wire, p.payload), (213.5, 362.5));
        // 300 bytes take a 4-byte header, 125 bytes a 2-byte one.
        assert_eq!(p.plain_wire, (304.0 * 2.0 + 127.0) / 2.0);
        t.add(&t.clone());
        assert_eq!((t.events, t.messages, t.compressed_messages), (4, 6, 4));
    }
}
