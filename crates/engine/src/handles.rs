//! Metric handles looked up once, for the series recorded per event or
//! per commit. `metrics::counter!` looks its series up in the recorder on
//! every call (a hash of the key, a map lookup, and through the status
//! page's tap a new handle); a holder of these keeps the handle from its
//! first use. Each is bound to the recorder current at its first use (the
//! binary installs its recorder before anything records), so it is held
//! by the object that records (the writer, the live index, the relay's
//! state), never in a static shared by tests with recorders of their own.

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram};

/// Distinct label values kept; a further value is looked up every time.
const SLOTS: usize = 16;

/// One unlabelled counter.
pub struct CounterHandle {
    name: &'static str,
    handle: OnceLock<Counter>,
}

impl CounterHandle {
    pub const fn new(name: &'static str) -> CounterHandle {
        CounterHandle {
            name,
            handle: OnceLock::new(),
        }
    }

    pub fn increment(&self, n: u64) {
        self.handle
            .get_or_init(|| metrics::counter!(self.name))
            .increment(n);
    }
}

/// One unlabelled histogram.
pub struct HistogramHandle {
    name: &'static str,
    handle: OnceLock<Histogram>,
}

impl HistogramHandle {
    pub const fn new(name: &'static str) -> HistogramHandle {
        HistogramHandle {
            name,
            handle: OnceLock::new(),
        }
    }

    pub fn record(&self, value: f64) {
        self.handle
            .get_or_init(|| metrics::histogram!(self.name))
            .record(value);
    }
}

/// One unlabelled gauge.
pub struct GaugeHandle {
    name: &'static str,
    handle: OnceLock<Gauge>,
}

impl GaugeHandle {
    pub const fn new(name: &'static str) -> GaugeHandle {
        GaugeHandle {
            name,
            handle: OnceLock::new(),
        }
    }

    pub fn set(&self, value: f64) {
        self.handle
            .get_or_init(|| metrics::gauge!(self.name))
            .set(value);
    }
}

/// A counter with one label whose values are a small closed set of
/// constants: one handle per value, each taken at the value's first use.
pub struct LabelledCounter {
    name: &'static str,
    label: &'static str,
    /// Filled in order, never emptied.
    slots: [OnceLock<(&'static str, Counter)>; SLOTS],
}

impl LabelledCounter {
    pub const fn new(name: &'static str, label: &'static str) -> LabelledCounter {
        LabelledCounter {
            name,
            label,
            slots: [const { OnceLock::new() }; SLOTS],
        }
    }

    /// Adds `n` to the series `label = value`. Two threads naming new
    /// values at once may race for a free slot: the loser sees the
    /// winner's value there and goes on to the next.
    pub fn increment(&self, value: &'static str, n: u64) {
        for slot in &self.slots {
            let (v, counter) =
                slot.get_or_init(|| (value, metrics::counter!(self.name, self.label => value)));
            if *v == value {
                counter.increment(n);
                return;
            }
        }
        metrics::counter!(self.name, self.label => value).increment(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::test_metrics::record;

    #[test]
    fn each_series_counts_what_the_macro_would() {
        let ((), got) = record(|| {
            let c = CounterHandle::new("sluice_test_plain_total");
            c.increment(2);
            c.increment(3);
            let h = HistogramHandle::new("sluice_test_seconds");
            h.record(0.5);
            let g = GaugeHandle::new("sluice_test_level");
            g.set(7.0);
            let l = LabelledCounter::new("sluice_test_labelled_total", "kind");
            // More values than slots: the rest are counted all the same.
            let values: Vec<&'static str> = (0..SLOTS + 3)
                .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
                .collect();
            for v in &values {
                l.increment(v, 1);
            }
            l.increment(values[0], 4);
            l.increment(values[SLOTS + 1], 6);
        });
        assert_eq!(got.counter("sluice_test_plain_total", &[]), 5);
        assert_eq!(got.histogram("sluice_test_seconds", &[]), vec![0.5]);
        assert_eq!(got.gauge("sluice_test_level", &[]), Some(7.0));
        let l = |v: &str| got.counter("sluice_test_labelled_total", &[("kind", v)]);
        assert_eq!((l("v0"), l("v1"), l(&format!("v{}", SLOTS + 1))), (5, 1, 7));
        assert_eq!(got.counters("sluice_test_labelled_total").len(), SLOTS + 3);
    }
}
