//! A gauge that counts owned things: [`GaugeGuard`] holds one up while it
//! lives (an open connection, subscription, negentropy session, an
//! authenticated connection), so the count cannot outlive what it counts.

/// One unit of a gauge, taken back on drop.
pub struct GaugeGuard(metrics::Gauge);

impl GaugeGuard {
    /// Adds one to the gauge `name` until the guard is dropped.
    pub fn hold(name: &'static str) -> GaugeGuard {
        let gauge = metrics::gauge!(name);
        gauge.increment(1.0);
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
