//! What the status sampler reads: a `metrics::Recorder` layer ([`Tap`])
//! over the relay's recorder (the Prometheus one, composed in
//! crates/sluice/src/telemetry.rs) that keeps the few series the status
//! shows in atomics of its own ([`Series`]) as they are recorded, so the
//! sampler reads them without rendering `/metrics`.
//!
//! Every operation on a listed series goes to the inner recorder's handle
//! unchanged, then to the series' cell with the same atomic operation the
//! Prometheus recorder applies to its own (the `metrics` crate's
//! `CounterFn` and `GaugeFn` for `AtomicU64`): a cell holds what
//! `/metrics` shows for its series, summed over its labels. A counter's
//! increments and a gauge's increments and decrements add up across label
//! sets; `absolute` and `set` are exact for a series with one label set,
//! which is how every listed series recorded that way is recorded (the
//! store gauges and `sluice_query_admitted_total`, unlabelled). The cells
//! are fixed: one per listed name, and the refusals one per throttle layer
//! (the status's table); other labels are summed away, and a series not
//! listed is passed through untouched.

use std::sync::Arc;

use metrics::atomics::AtomicU64;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use sluice_engine::metrics_names as em;
use sluice_throttle::refusal::Layer;

use crate::metrics_names as sm;

/// The counters the status reads, one cell each; the refusals
/// ([`em::THROTTLE_REFUSALS_TOTAL`]) are kept apart, by layer.
const COUNTERS: [&str; 6] = [
    sm::EVENTS_RECEIVED_TOTAL,
    sm::EVENTS_ACCEPTED_TOTAL,
    sm::LIVE_DELIVERIES_TOTAL,
    em::QUERY_EVENTS_TOTAL,
    em::QUERY_ADMITTED_TOTAL,
    em::WRITER_QUEUE_FULL_TOTAL,
];

/// The gauges the status reads, one cell each.
const GAUGES: [&str; 9] = [
    sm::CONNECTIONS_OPEN,
    sm::SUBSCRIPTIONS_OPEN,
    em::STORE_EVENTS,
    em::STORE_USED_BYTES,
    em::STORE_FILE_BYTES,
    em::RETENTION_TARGET_BYTES,
    em::STORE_DISK_FREE_BYTES,
    em::STORE_DISK_TOTAL_BYTES,
    em::STORE_DISK_MIN_FREE_BYTES,
];

/// The label of [`em::THROTTLE_REFUSALS_TOTAL`] the status groups by.
const LAYER: &str = "layer";

/// The values of the listed series, as the [`Tap`] records them.
#[derive(Debug, Default)]
pub struct Series {
    counters: [Arc<AtomicU64>; COUNTERS.len()],
    /// By [`Layer::ALL`]'s order.
    refusals: [Arc<AtomicU64>; Layer::ALL.len()],
    /// `f64` bits, as the Prometheus recorder keeps a gauge.
    gauges: [Arc<AtomicU64>; GAUGES.len()],
}

impl Series {
    /// Every series name kept here.
    pub fn names() -> impl Iterator<Item = &'static str> {
        COUNTERS
            .into_iter()
            .chain(std::iter::once(em::THROTTLE_REFUSALS_TOTAL))
            .chain(GAUGES)
    }

    /// The value of a listed series, summed over its labels as the status
    /// sums what `/metrics` shows (the refusals: over the layers of
    /// [`Layer::ALL`]); 0 until recorded, `None` for a name not listed.
    pub fn value(&self, name: &str) -> Option<f64> {
        if name == em::THROTTLE_REFUSALS_TOTAL {
            return Some(self.refusals().sum());
        }
        if let Some(i) = COUNTERS.iter().position(|n| *n == name) {
            return self.counters.get(i).map(|c| count(c));
        }
        let i = GAUGES.iter().position(|n| *n == name)?;
        self.gauges.get(i).map(|g| level(g))
    }

    /// The refusals by layer, in [`Layer::ALL`]'s order.
    pub fn refusals(&self) -> impl Iterator<Item = f64> + '_ {
        self.refusals.iter().map(|c| count(c))
    }

    /// The cell of a counter, if the status reads it.
    fn counter_cell(&self, key: &Key) -> Option<&Arc<AtomicU64>> {
        let name = key.name();
        if name == em::THROTTLE_REFUSALS_TOTAL {
            let layer = key.labels().find(|l| l.key() == LAYER)?;
            let i = Layer::ALL
                .iter()
                .position(|l| l.as_str() == layer.value())?;
            return self.refusals.get(i);
        }
        let i = COUNTERS.iter().position(|n| *n == name)?;
        self.counters.get(i)
    }

    /// The cell of a gauge, if the status reads it.
    fn gauge_cell(&self, key: &Key) -> Option<&Arc<AtomicU64>> {
        let i = GAUGES.iter().position(|n| *n == key.name())?;
        self.gauges.get(i)
    }
}

fn count(cell: &AtomicU64) -> f64 {
    cell.load(std::sync::atomic::Ordering::Acquire) as f64
}

fn level(cell: &AtomicU64) -> f64 {
    f64::from_bits(cell.load(std::sync::atomic::Ordering::Acquire))
}

/// A recorder that records into `inner` and keeps the status's series in
/// its [`Series`] too.
pub struct Tap<R> {
    inner: R,
    series: Arc<Series>,
}

impl<R> Tap<R> {
    pub fn new(inner: R, series: Arc<Series>) -> Tap<R> {
        Tap { inner, series }
    }
}

/// A handle of the inner recorder and the cell of its series.
struct Both<H> {
    inner: H,
    cell: Arc<AtomicU64>,
}

impl CounterFn for Both<Counter> {
    fn increment(&self, value: u64) {
        self.inner.increment(value);
        CounterFn::increment(&*self.cell, value);
    }

    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
        CounterFn::absolute(&*self.cell, value);
    }
}

impl GaugeFn for Both<Gauge> {
    fn increment(&self, value: f64) {
        self.inner.increment(value);
        GaugeFn::increment(&*self.cell, value);
    }

    fn decrement(&self, value: f64) {
        self.inner.decrement(value);
        GaugeFn::decrement(&*self.cell, value);
    }

    fn set(&self, value: f64) {
        self.inner.set(value);
        GaugeFn::set(&*self.cell, value);
    }
}

impl<R: Recorder> Recorder for Tap<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let inner = self.inner.register_counter(key, metadata);
        match self.series.counter_cell(key) {
            Some(cell) => Counter::from_arc(Arc::new(Both {
                inner,
                cell: cell.clone(),
            })),
            None => inner,
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let inner = self.inner.register_gauge(key, metadata);
        match self.series.gauge_cell(key) {
            Some(cell) => Gauge::from_arc(Arc::new(Both {
                inner,
                cell: cell.clone(),
            })),
            None => inner,
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::NoopRecorder;

    /// Records through a [`Tap`] over a recorder that keeps nothing: what
    /// the status reads comes from the tap's cells alone.
    fn tapped(f: impl FnOnce()) -> Arc<Series> {
        let series = Arc::new(Series::default());
        metrics::with_local_recorder(&Tap::new(NoopRecorder, series.clone()), f);
        series
    }

    #[test]
    fn the_cells_follow_what_is_recorded_summed_over_labels() {
        let s = tapped(|| {
            metrics::counter!(sm::EVENTS_RECEIVED_TOTAL, "kind_class" => "regular").increment(10);
            metrics::counter!(sm::EVENTS_RECEIVED_TOTAL, "kind_class" => "ephemeral").increment(2);
            metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(7);
            metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(5);
            let open = metrics::gauge!(sm::CONNECTIONS_OPEN);
            open.increment(3.0);
            open.decrement(1.0);
            metrics::gauge!(em::STORE_USED_BYTES).set(1024.0);
            metrics::gauge!(em::STORE_USED_BYTES).set(512.5);
            metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "write", "layer" => "ip_bucket", "reason" => "rate").increment(6);
            metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "read", "layer" => "ip_bucket", "reason" => "rate").increment(1);
            metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "write", "layer" => "no_such_layer", "reason" => "rate").increment(50);
            // Not listed: passed through, kept nowhere here.
            metrics::counter!(sm::CONNECTIONS_OPENED_TOTAL).increment(99);
            metrics::gauge!(sm::HTTP_CONNECTIONS_OPEN).set(99.0);
        });
        assert_eq!(s.value(sm::EVENTS_RECEIVED_TOTAL), Some(12.0));
        assert_eq!(s.value(em::QUERY_ADMITTED_TOTAL), Some(7.0), "max");
        assert_eq!(s.value(sm::CONNECTIONS_OPEN), Some(2.0));
        assert_eq!(s.value(em::STORE_USED_BYTES), Some(512.5));
        assert_eq!(s.value(em::STORE_EVENTS), Some(0.0), "never recorded");
        assert_eq!(s.value(sm::CONNECTIONS_OPENED_TOTAL), None);
        assert_eq!(s.value(sm::HTTP_CONNECTIONS_OPEN), None);
        let ip = Layer::ALL
            .iter()
            .position(|l| *l == Layer::IpBucket)
            .unwrap();
        let by_layer: Vec<f64> = s.refusals().collect();
        assert_eq!(by_layer[ip], 7.0);
        assert_eq!(by_layer.iter().sum::<f64>(), 7.0, "unknown layer: not kept");
        assert_eq!(s.value(em::THROTTLE_REFUSALS_TOTAL), Some(7.0));
    }

    #[test]
    fn every_listed_name_has_a_cell() {
        let names: Vec<&str> = Series::names().collect();
        assert_eq!(names.len(), COUNTERS.len() + 1 + GAUGES.len());
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in names {
            assert!(Series::default().value(name).is_some(), "{name}");
        }
    }
}
