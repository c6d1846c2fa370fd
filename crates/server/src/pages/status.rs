//! The live status: `/status` (a page) and `/status.json` (what its script
//! polls). A task ([`run_sampler`]) reads, once a second, the series of
//! `/metrics` the page shows, kept as they are recorded by a layer over the
//! recorder ([`tap`]: no rendering of `/metrics`), and the throttle's last
//! governor state (what `/api/throttle` shows), turns the counters into
//! rates, and keeps the last [`HISTORY`] samples in a bounded ring. Nothing
//! here names a client: the series it keeps are summed over their labels
//! (the refusals kept by layer), and it keeps only the series it lists.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_engine::metrics_names as em;
use sluice_throttle::refusal::Layer;
use sluice_throttle::{GovernorState, Verdict};

use super::html::{bytes, escape};
use crate::AppState;
use crate::metrics_names as sm;

pub mod tap;

pub use tap::{Series, Tap};

/// Samples kept: five minutes at one a second.
pub const HISTORY: usize = 300;
/// How often the sampler reads.
pub const EVERY: Duration = Duration::from_secs(1);
/// The refusal layer of EVENTs refused because the writer's queue was full.
const WRITER_QUEUE: &str = "writer_queue";

/// One point of the charts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// Unix time of the reading, seconds.
    pub t: u64,
    pub connections: f64,
    /// Per second, over the last interval.
    pub events_in: f64,
    pub events_out: f64,
    pub queries: f64,
    pub refusals: f64,
    /// The controllers' outputs (0: no delay, 1: the cap).
    pub write_output: f64,
    pub read_output: f64,
    pub emergency: bool,
}

/// Everything the page shows now.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Now {
    #[serde(flatten)]
    pub sample: Sample,
    /// EVENTs answered OK true, per second.
    pub events_accepted: f64,
    pub subscriptions: f64,
    /// `throttle.mode`.
    pub mode: &'static str,
    pub write: Controller,
    pub read: Controller,
    pub emergency_entered_total: u64,
    pub memory: Memory,
    /// By layer: per second over the last interval, and since start.
    pub refusals_by_layer: BTreeMap<&'static str, Refusals>,
    pub store: Store,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Controller {
    pub output: f64,
    /// The delay its verdict carries, ms.
    pub delay_ms: f64,
    /// `allow`, `delay` or `refuse`.
    pub verdict: &'static str,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Memory {
    pub bytes: u64,
    pub target_bytes: u64,
    pub pressure: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Refusals {
    pub per_s: f64,
    pub total: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Store {
    pub events: f64,
    pub used_bytes: f64,
    pub file_bytes: f64,
    /// `retention.max_store_mb` in bytes; 0: none.
    pub retention_target_bytes: f64,
    pub disk_free_bytes: f64,
    pub disk_total_bytes: f64,
    /// `store.min_free_disk_mb` in bytes: writes stop under it.
    pub disk_min_free_bytes: f64,
}

/// The document `/status.json` answers.
#[derive(Debug, Serialize)]
pub struct Document {
    pub version: &'static str,
    pub interval_secs: u64,
    /// `null` until the sampler has read twice.
    pub now: Option<Now>,
    /// Oldest first, at most [`HISTORY`].
    pub history: Vec<Sample>,
}

/// The ring and the last reading, shared by the sampler and the handlers.
#[derive(Default)]
pub struct Board {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    last: Option<Reading>,
    now: Option<Now>,
    history: VecDeque<Sample>,
}

impl Board {
    /// Takes one reading: rates against the previous one.
    pub fn record(&self, reading: Reading, state: Option<&GovernorState>, extra: Extra) {
        let mut inner = self.inner.lock();
        if let Some(prev) = inner.last.take() {
            let now = now_from(&prev, &reading, state, extra);
            if inner.history.len() == HISTORY {
                inner.history.pop_front();
            }
            inner.history.push_back(now.sample);
            inner.now = Some(now);
        }
        inner.last = Some(reading);
    }

    pub fn document(&self) -> Document {
        let inner = self.inner.lock();
        Document {
            version: env!("CARGO_PKG_VERSION"),
            interval_secs: EVERY.as_secs(),
            now: inner.now.clone(),
            history: inner.history.iter().copied().collect(),
        }
    }
}

/// What the sampler knows besides the metrics.
#[derive(Debug, Clone, Copy)]
pub struct Extra {
    pub unix_now: u64,
    pub mode: &'static str,
    pub target_memory_bytes: u64,
}

/// Reads `series` every [`EVERY`] until `st.shutdown`.
pub async fn run_sampler(st: Arc<AppState>, series: Arc<Series>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = st.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let reading = Reading::read(&series, Instant::now());
        let t = st.engine.limiter();
        let extra = Extra {
            unix_now: sluice_engine::clock::unix_now(),
            mode: t.mode().as_str(),
            target_memory_bytes: t.with_config(|c| c.target_memory_mb.saturating_mul(1 << 20)),
        };
        st.status.record(reading, t.state().as_ref(), extra);
    }
}

/// The counters and gauges of one reading of the [`Series`].
#[derive(Debug, Clone, Default)]
pub struct Reading {
    at: Option<Instant>,
    events_in: f64,
    events_accepted: f64,
    events_out: f64,
    queries: f64,
    /// [`Layer::ALL`], then the writer's queue.
    refusals: [f64; Layer::ALL.len() + 1],
    connections: f64,
    subscriptions: f64,
    store: Store,
}

impl Reading {
    /// The series this page uses, as they are now.
    pub fn read(series: &Series, at: Instant) -> Reading {
        let v = |name| series.value(name).unwrap_or(0.0);
        let mut refusals = [0.0; Layer::ALL.len() + 1];
        for (slot, n) in refusals.iter_mut().zip(series.refusals()) {
            *slot = n;
        }
        if let Some(queue) = refusals.last_mut() {
            *queue = v(em::WRITER_QUEUE_FULL_TOTAL);
        }
        Reading {
            at: Some(at),
            events_in: v(sm::EVENTS_RECEIVED_TOTAL),
            events_accepted: v(sm::EVENTS_ACCEPTED_TOTAL),
            events_out: v(sm::LIVE_DELIVERIES_TOTAL) + v(em::QUERY_EVENTS_TOTAL),
            queries: v(em::QUERY_ADMITTED_TOTAL),
            refusals,
            connections: v(sm::CONNECTIONS_OPEN),
            subscriptions: v(sm::SUBSCRIPTIONS_OPEN),
            store: Store {
                events: v(em::STORE_EVENTS),
                used_bytes: v(em::STORE_USED_BYTES),
                file_bytes: v(em::STORE_FILE_BYTES),
                retention_target_bytes: v(em::RETENTION_TARGET_BYTES),
                disk_free_bytes: v(em::STORE_DISK_FREE_BYTES),
                disk_total_bytes: v(em::STORE_DISK_TOTAL_BYTES),
                disk_min_free_bytes: v(em::STORE_DISK_MIN_FREE_BYTES),
            },
        }
    }
}

fn layer_names() -> impl Iterator<Item = &'static str> {
    Layer::ALL
        .iter()
        .map(|l| l.as_str())
        .chain(std::iter::once(WRITER_QUEUE))
}

fn now_from(prev: &Reading, cur: &Reading, state: Option<&GovernorState>, x: Extra) -> Now {
    let secs = match (prev.at, cur.at) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    // A counter never goes back; a rate over no time is 0.
    let rate = |a: f64, b: f64| {
        if secs > 0.0 {
            ((b - a) / secs).max(0.0)
        } else {
            0.0
        }
    };
    let refusals_by_layer: BTreeMap<&'static str, Refusals> = layer_names()
        .zip(prev.refusals.iter().zip(cur.refusals.iter()))
        .map(|(name, (&a, &b))| {
            (
                name,
                Refusals {
                    per_s: rate(a, b),
                    total: b,
                },
            )
        })
        .collect();
    let controller = |d: Option<&sluice_throttle::DirectionState>| match d {
        Some(d) => Controller {
            output: d.pid.output,
            delay_ms: d.delay_ns as f64 / 1e6,
            verdict: match d.verdict {
                Verdict::Allow => "allow",
                Verdict::Delay(_) => "delay",
                Verdict::Refuse(_) => "refuse",
            },
        },
        None => Controller {
            verdict: "allow",
            ..Controller::default()
        },
    };
    let write = controller(state.map(|s| &s.write));
    let read = controller(state.map(|s| &s.read));
    let emergency = state.is_some_and(|s| s.emergency);
    Now {
        sample: Sample {
            t: x.unix_now,
            connections: cur.connections,
            events_in: rate(prev.events_in, cur.events_in),
            events_out: rate(prev.events_out, cur.events_out),
            queries: rate(prev.queries, cur.queries),
            refusals: refusals_by_layer.values().map(|r| r.per_s).sum(),
            write_output: write.output,
            read_output: read.output,
            emergency,
        },
        events_accepted: rate(prev.events_accepted, cur.events_accepted),
        subscriptions: cur.subscriptions,
        mode: x.mode,
        write,
        read,
        emergency_entered_total: state.map_or(0, |s| s.emergency_entered_total),
        memory: Memory {
            bytes: state.map_or(0, |s| s.memory_bytes),
            target_bytes: x.target_memory_bytes,
            pressure: state.map_or(0.0, |s| s.memory_pressure),
        },
        refusals_by_layer,
        store: cur.store,
    }
}

const TEMPLATE: &str = include_str!("assets/status.html");

/// Chart size, in the SVG's own units.
const CHART_W: f64 = 600.0;
const CHART_H: f64 = 150.0;

/// The status page, with the numbers of `doc` already in it (the script
/// refreshes them; without it the page reloads itself).
pub fn page(doc: &Document, name: &str) -> String {
    let now = doc.now.clone().unwrap_or_default();
    let n = format_number;
    let mut refusal_rows = String::new();
    for (layer, r) in &now.refusals_by_layer {
        let _ = write!(
            refusal_rows,
            r#"<tr><th scope="row">{}</th><td data-field="refusals_by_layer.{layer}.per_s" data-format="rate">{}</td><td data-field="refusals_by_layer.{layer}.total" data-format="int">{}</td></tr>"#,
            escape(&layer.replace('_', " ")),
            n(r.per_s),
            r.total.round(),
        );
    }
    let (traffic, throttle, chart_max) = charts(&doc.history);
    let s = &now.store;
    let values = [
        ("{{name}}", escape(name)),
        ("{{version}}", escape(doc.version)),
        ("{{connections}}", n(now.sample.connections)),
        ("{{subscriptions}}", n(now.subscriptions)),
        ("{{events_in}}", n(now.sample.events_in)),
        ("{{events_accepted}}", n(now.events_accepted)),
        ("{{events_out}}", n(now.sample.events_out)),
        ("{{queries}}", n(now.sample.queries)),
        ("{{mode}}", escape(now.mode)),
        ("{{write_output}}", format!("{:.2}", now.write.output)),
        ("{{write_delay}}", n(now.write.delay_ms)),
        ("{{write_verdict}}", escape(now.write.verdict)),
        ("{{read_output}}", format!("{:.2}", now.read.output)),
        ("{{read_delay}}", n(now.read.delay_ms)),
        ("{{read_verdict}}", escape(now.read.verdict)),
        (
            "{{emergency}}",
            if now.sample.emergency { "on" } else { "off" }.into(),
        ),
        (
            "{{emergency_entered}}",
            now.emergency_entered_total.to_string(),
        ),
        ("{{memory}}", bytes(now.memory.bytes)),
        ("{{memory_target}}", bytes(now.memory.target_bytes)),
        ("{{refusal_rows}}", refusal_rows),
        ("{{store_events}}", n(s.events)),
        ("{{store_used}}", bytes(s.used_bytes as u64)),
        ("{{store_file}}", bytes(s.file_bytes as u64)),
        (
            "{{store_target}}",
            if s.retention_target_bytes > 0.0 {
                bytes(s.retention_target_bytes as u64)
            } else {
                "none".into()
            },
        ),
        (
            "{{store_meter_max}}",
            s.retention_target_bytes
                .max(s.used_bytes)
                .max(1.0)
                .to_string(),
        ),
        ("{{store_meter_value}}", s.used_bytes.to_string()),
        ("{{disk_free}}", bytes(s.disk_free_bytes as u64)),
        ("{{disk_total}}", bytes(s.disk_total_bytes as u64)),
        ("{{disk_min_free}}", bytes(s.disk_min_free_bytes as u64)),
        (
            "{{disk_meter_max}}",
            s.disk_total_bytes.max(1.0).to_string(),
        ),
        (
            "{{disk_meter_value}}",
            (s.disk_total_bytes - s.disk_free_bytes)
                .max(0.0)
                .to_string(),
        ),
        ("{{samples}}", doc.history.len().to_string()),
        ("{{chart_max}}", n(chart_max)),
        ("{{traffic}}", traffic),
        ("{{throttle}}", throttle),
    ];
    super::landing::fill(TEMPLATE, &values)
}

/// A number as the page writes it: one decimal under 10, else whole.
pub fn format_number(v: f64) -> String {
    if v.abs() < 10.0 && v.fract() != 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// The polylines of the two charts: traffic (events in, out, queries per
/// second, scaled to their largest value) and the controllers' outputs
/// (0 to 1), and the traffic chart's scale. `status.js` draws the same
/// from each refresh.
fn charts(history: &[Sample]) -> (String, String, f64) {
    let series = |f: fn(&Sample) -> f64| history.iter().map(f).collect::<Vec<f64>>();
    let ins = series(|s| s.events_in);
    let outs = series(|s| s.events_out);
    let queries = series(|s| s.queries);
    let max = ins
        .iter()
        .chain(&outs)
        .chain(&queries)
        .fold(1.0f64, |m, &v| m.max(v));
    let traffic = format!(
        r#"<polyline class="line in" points="{}"/><polyline class="line out" points="{}"/><polyline class="line queries" points="{}"/>"#,
        points(&ins, max),
        points(&outs, max),
        points(&queries, max)
    );
    let throttle = format!(
        r#"<polyline class="line write" points="{}"/><polyline class="line read" points="{}"/>"#,
        points(&series(|s| s.write_output), 1.0),
        points(&series(|s| s.read_output), 1.0)
    );
    (traffic, throttle, max)
}

/// SVG points of `values`, the newest at the right edge, one step per
/// sample of a full ring.
fn points(values: &[f64], max: f64) -> String {
    let step = CHART_W / (HISTORY - 1) as f64;
    let start = CHART_W - step * values.len().saturating_sub(1) as f64;
    let mut out = String::new();
    for (i, v) in values.iter().enumerate() {
        let x = start + step * i as f64;
        let y = CHART_H - (v / max).clamp(0.0, 1.0) * CHART_H;
        let _ = write!(out, "{x:.1},{y:.1} ");
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests;
