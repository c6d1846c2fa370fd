//! What the code under test counted, set and recorded, for the engine's
//! tests: a recorder installed on the calling thread only
//! (`metrics::with_local_recorder`), so tests running side by side never
//! see each other's metrics.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

#[derive(Default)]
struct State {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

/// The metrics recorded by [`record`].
#[derive(Clone, Default)]
pub(crate) struct Recorded(Arc<Mutex<State>>);

/// Runs `f` with a recorder of its own on this thread.
pub(crate) fn record<T>(f: impl FnOnce() -> T) -> (T, Recorded) {
    let recorded = Recorded::default();
    let out = metrics::with_local_recorder(&recorded, f);
    (out, recorded)
}

/// `name{k=v,...}`, the labels sorted.
fn name(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

impl Recorded {
    /// A counter's total (0 if never incremented).
    pub(crate) fn counter(&self, metric: &str, labels: &[(&str, &str)]) -> u64 {
        let key = name(metric, labels);
        self.0.lock().counters.get(&key).copied().unwrap_or(0)
    }

    /// Every counter of `metric` that was incremented, by its labels.
    pub(crate) fn counters(&self, metric: &str) -> Vec<(String, u64)> {
        let prefix = format!("{metric}{{");
        (self.0.lock().counters.iter())
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// A gauge's last value, if it was set.
    pub(crate) fn gauge(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let key = name(metric, labels);
        self.0.lock().gauges.get(&key).copied()
    }

    /// A histogram's values, in order.
    pub(crate) fn histogram(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let key = name(metric, labels);
        self.0
            .lock()
            .histograms
            .get(&key)
            .cloned()
            .unwrap_or_default()
    }
}

struct Handle {
    key: String,
    recorded: Recorded,
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self
            .recorded
            .0
            .lock()
            .counters
            .entry(self.key.clone())
            .or_default() += value;
    }

    fn absolute(&self, value: u64) {
        self.recorded
            .0
            .lock()
            .counters
            .insert(self.key.clone(), value);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        *self
            .recorded
            .0
            .lock()
            .gauges
            .entry(self.key.clone())
            .or_default() += value;
    }

    fn decrement(&self, value: f64) {
        *self
            .recorded
            .0
            .lock()
            .gauges
            .entry(self.key.clone())
            .or_default() -= value;
    }

    fn set(&self, value: f64) {
        self.recorded
            .0
            .lock()
            .gauges
            .insert(self.key.clone(), value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        (self.recorded.0.lock().histograms)
            .entry(self.key.clone())
            .or_default()
            .push(value);
    }
}

impl Recorded {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        Arc::new(Handle {
            key: name(key.name(), &labels),
            recorded: self.clone(),
        })
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}
