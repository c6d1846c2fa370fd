//! Metric handles looked up once, for the series recorded per event or
//! per commit. `metrics::counter!` looks its series up in the recorder on
//! every call (a hash of the key, a map lookup, and through the status
//! page's tap a new handle); a holder of these keeps the handle from its
//! first use. Each is bound to the recorder current at its first use (the
//! binary installs its recorder before anything records), so it is held
//! by the object that records (the writer, the live index, the relay's
//! state), never in a static shared by tests with recorders of their own.
//! [`Slots`] is the keyed table behind [`LabelledCounter`] and the gauge
//! guards.

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram};

/// Distinct label values a [`LabelledCounter`] keeps; a further value is
/// looked up every time.
const LABEL_SLOTS: usize = 16;

/// Up to `N` values keyed by a `&'static str`, each made at its key's
/// first use. Filled in order and never emptied, so a slot's index names
/// its value for good.
pub struct Slots<H, const N: usize> {
    cells: [OnceLock<(&'static str, H)>; N],
}

impl<H, const N: usize> Slots<H, N> {
    pub const fn new() -> Self {
        Slots {
            cells: [const { OnceLock::new() }; N],
        }
    }

    /// The slot of `key` and its value, taking the first free slot (and
    /// making the value) at the key's first use; `None` when all `N` are
    /// taken by other keys. Two threads naming new keys at once may race
    /// for a free slot: the loser sees the winner's key there and goes on
    /// to the next.
    pub fn find(&self, key: &'static str, make: impl Fn() -> H) -> Option<(usize, &H)> {
        for (i, cell) in self.cells.iter().enumerate() {
            // `make` runs at most once: only in the slot this key then owns.
            let (k, value) = cell.get_or_init(|| (key, make()));
            if *k == key {
                return Some((i, value));
            }
        }
        None
    }

    /// The key and value in slot `index`, once it is filled.
    pub fn get(&self, index: usize) -> Option<&(&'static str, H)> {
        self.cells.get(index)?.get()
    }
}

impl<H, const N: usize> Default for Slots<H, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// One unlabelled series (a [`Counter`], [`Histogram`] or [`Gauge`]),
/// looked up at its first use.
pub struct Handle<T> {
    name: &'static str,
    make: fn(&'static str) -> T,
    handle: OnceLock<T>,
}

impl<T> Handle<T> {
    const fn with(name: &'static str, make: fn(&'static str) -> T) -> Handle<T> {
        Handle {
            name,
            make,
            handle: OnceLock::new(),
        }
    }

    /// The series' handle, looked up on the first call.
    pub fn get(&self) -> &T {
        self.handle.get_or_init(|| (self.make)(self.name))
    }
}

impl Handle<Counter> {
    pub const fn counter(name: &'static str) -> Handle<Counter> {
        Handle::with(name, |n| metrics::counter!(n))
    }
}

impl Handle<Histogram> {
    pub const fn histogram(name: &'static str) -> Handle<Histogram> {
        Handle::with(name, |n| metrics::histogram!(n))
    }
}

impl Handle<Gauge> {
    pub const fn gauge(name: &'static str) -> Handle<Gauge> {
        Handle::with(name, |n| metrics::gauge!(n))
    }
}

/// A counter with one label whose values are a small closed set of
/// constants: one handle per value, each taken at the value's first use.
pub struct LabelledCounter {
    name: &'static str,
    label: &'static str,
    slots: Slots<Counter, LABEL_SLOTS>,
}

impl LabelledCounter {
    pub const fn new(name: &'static str, label: &'static str) -> LabelledCounter {
        LabelledCounter {
            name,
            label,
            slots: Slots::new(),
        }
    }

    /// Adds `n` to the series `label = value`.
    pub fn increment(&self, value: &'static str, n: u64) {
        let make = || metrics::counter!(self.name, self.label => value);
        match self.slots.find(value, make) {
            Some((_, counter)) => counter.increment(n),
            None => make().increment(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::test_metrics::record;

    #[test]
    fn each_series_counts_what_the_macro_would() {
        let ((), got) = record(|| {
            let c = Handle::counter("sluice_test_plain_total");
            c.get().increment(2);
            c.get().increment(3);
            let h = Handle::histogram("sluice_test_seconds");
            h.get().record(0.5);
            let g = Handle::gauge("sluice_test_level");
            g.get().set(7.0);
            let l = LabelledCounter::new("sluice_test_labelled_total", "kind");
            // More values than slots: the rest are counted all the same.
            let values: Vec<&'static str> = (0..LABEL_SLOTS + 3)
                .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
                .collect();
            for v in &values {
                l.increment(v, 1);
            }
            l.increment(values[0], 4);
            l.increment(values[LABEL_SLOTS + 1], 6);
        });
        assert_eq!(got.counter("sluice_test_plain_total", &[]), 5);
        assert_eq!(got.histogram("sluice_test_seconds", &[]), vec![0.5]);
        assert_eq!(got.gauge("sluice_test_level", &[]), Some(7.0));
        let l = |v: &str| got.counter("sluice_test_labelled_total", &[("kind", v)]);
        assert_eq!(
            (l("v0"), l("v1"), l(&format!("v{}", LABEL_SLOTS + 1))),
            (5, 1, 7)
        );
        assert_eq!(
            got.counters("sluice_test_labelled_total").len(),
            LABEL_SLOTS + 3
        );
    }
}
