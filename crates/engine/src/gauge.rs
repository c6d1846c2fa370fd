//! A gauge that counts owned things: [`GaugeGuard`] holds one up while it
//! lives (an open connection, subscription, negentropy session, an
//! authenticated connection), so the count cannot outlive what it counts.

use std::sync::{Mutex, PoisonError};

/// One unit of a gauge, taken back on drop.
pub struct GaugeGuard(metrics::Gauge);

impl GaugeGuard {
    /// Adds one to the gauge `name` until the guard is dropped.
    ///
    /// The gauge's handle is looked up once per name and shared: a lookup
    /// allocates a handle, and every connection holds guards. The metrics
    /// recorder must be installed before the first guard (the binary
    /// installs it before anything else).
    pub fn hold(name: &'static str) -> GaugeGuard {
        static HANDLES: Mutex<Vec<(&'static str, metrics::Gauge)>> = Mutex::new(Vec::new());
        let gauge = {
            let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
            match handles.iter().find(|(n, _)| *n == name) {
                Some((_, g)) => g.clone(),
                None => {
                    let g = metrics::gauge!(name);
                    handles.push((name, g.clone()));
                    g
                }
            }
        };
        gauge.increment(1.0);
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
