//! A gauge that counts owned things: [`GaugeGuard`] holds one up while it
//! lives (an open connection, subscription, negentropy session, an
//! authenticated connection), so the count cannot outlive what it counts.

use crate::handles::Slots;

/// Gauges guards can name: each name takes a slot at its first guard.
const SLOTS: usize = 16;

/// The gauges' handles, looked up once per name (a lookup allocates a
/// handle, and every connection holds guards). A slot is never emptied,
/// so a guard keeps only its slot's index.
static HANDLES: Slots<metrics::Gauge, SLOTS> = Slots::new();

/// One unit of a gauge, taken back on drop. One byte: a connection holds
/// several.
pub struct GaugeGuard(u8);

impl GaugeGuard {
    /// Adds one to the gauge `name` until the guard is dropped.
    ///
    /// The metrics recorder must be installed before the first guard (the
    /// binary installs it before anything else).
    ///
    /// # Panics
    /// When more than 16 names are held by guards (a programming error:
    /// the names are constants).
    pub fn hold(name: &'static str) -> GaugeGuard {
        let Some((slot, gauge)) = HANDLES.find(name, || metrics::gauge!(name)) else {
            panic!("more than {SLOTS} gauges held by guards");
        };
        gauge.increment(1.0);
        GaugeGuard(slot as u8)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        // The slot was filled before the guard was made, and is never emptied.
        if let Some((_, gauge)) = HANDLES.get(self.0 as usize) {
            gauge.decrement(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_keeps_one_slot_and_guards_are_one_byte() {
        assert_eq!(std::mem::size_of::<GaugeGuard>(), 1);
        let a = GaugeGuard::hold("sluice_test_gauge_a");
        let b = GaugeGuard::hold("sluice_test_gauge_b");
        let a2 = GaugeGuard::hold("sluice_test_gauge_a");
        assert_eq!(a.0, a2.0);
        assert_ne!(a.0, b.0);
        assert_eq!(HANDLES.get(a.0 as usize).unwrap().0, "sluice_test_gauge_a");
        assert_eq!(HANDLES.get(b.0 as usize).unwrap().0, "sluice_test_gauge_b");
    }
}
