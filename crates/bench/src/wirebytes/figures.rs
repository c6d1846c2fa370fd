//! The figures of a `wire` run: bytes per event, each phase's counts, and
//! the median over stored rounds.

use serde::Serialize;

use crate::stats::PrefixCounts;
use crate::wsraw::codec::{MsgSize, server_frame_len};

/// What one connection's handshake showed.
pub struct HandshakeSeen {
    pub extensions: Option<String>,
    pub sent: u64,
    pub received: u64,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct PublishFigures {
    pub sent: u64,
    /// OK true, duplicates included.
    pub accepted: u64,
    /// OK true with `duplicate:`: already stored, so not delivered live.
    pub duplicates: u64,
    pub refused: u64,
    pub refused_prefixes: PrefixCounts,
    /// Events without an OK within the timeout.
    pub timeouts: u64,
    pub secs: f64,
}

/// Bytes a set of messages took, and the events among them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Bytes {
    pub events: u64,
    /// Frames read, headers included.
    pub wire: u64,
    /// Their payloads after inflating.
    pub payload: u64,
    /// What the same messages take uncompressed (payload plus frame headers).
    pub plain_wire: u64,
    pub messages: u64,
    pub compressed_messages: u64,
}

impl Bytes {
    /// Counts one message.
    pub fn add_msg(&mut self, size: &MsgSize) {
        self.wire += size.wire as u64;
        self.payload += size.payload as u64;
        self.plain_wire += server_frame_len(size.payload) as u64;
        self.messages += 1;
        self.compressed_messages += u64::from(size.compressed);
    }

    pub fn add(&mut self, o: &Bytes) {
        self.events += o.events;
        self.wire += o.wire;
        self.payload += o.payload;
        self.plain_wire += o.plain_wire;
        self.messages += o.messages;
        self.compressed_messages += o.compressed_messages;
    }

    /// Wire, payload and plain-wire bytes per event.
    pub fn per_event(&self) -> PerEvent {
        let per = |v: u64| v as f64 / self.events.max(1) as f64;
        PerEvent {
            wire: per(self.wire),
            payload: per(self.payload),
            plain_wire: per(self.plain_wire),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct PerEvent {
    pub wire: f64,
    pub payload: f64,
    pub plain_wire: f64,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct LiveFigures {
    pub subscribers: usize,
    /// REQs each subscriber holds.
    pub reqs: usize,
    /// Events each subscriber should receive: accepted, not duplicates.
    pub expected_per_subscriber: u64,
    /// The EVENTs the subscribers read after their EOSEs, all together.
    pub received: Bytes,
    /// Other messages read meanwhile (NOTICE, CLOSED, AUTH, ...).
    pub other: Bytes,
    pub per_event: PerEvent,
    /// CLOSED answers to the live REQs, by prefix.
    pub closed: PrefixCounts,
    /// From the first EVENT sent to the last subscriber done.
    pub secs: f64,
    pub relay_cpu_secs: Option<f64>,
    /// Relay CPU per delivery (ingest included, see the module notes).
    pub relay_cpu_us_per_event: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct StoredRound {
    /// The answers (EVENTs and the EOSE or CLOSED) to every REQ of the round.
    pub received: Bytes,
    /// Other messages read meanwhile (an AUTH challenge on connecting, ...).
    pub other: Bytes,
    /// The REQs and CLOSEs written.
    pub sent_bytes: u64,
    pub closed: PrefixCounts,
    pub secs: f64,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct StoredFigures {
    /// Ids asked for: the accepted events.
    pub requested: u64,
    pub reqs_per_round: usize,
    pub rounds: Vec<StoredRound>,
    /// The median round's figures, each taken apart.
    pub per_event: PerEvent,
    pub relay_cpu_secs: Option<f64>,
    /// Relay CPU over all rounds' REQs per event served.
    pub relay_cpu_us_per_event: Option<f64>,
}

/// The median of some figures (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
