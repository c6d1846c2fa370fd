//! A connection's own operation rate, as an exponentially weighted moving
//! average with a one-second time constant. The engine uses it to aim the
//! global controller at the connections that cause the load: a connection
//! below the polite rate is never delayed or refused by the controller
//! (emergency mode still refuses everyone).

/// Time constant of the average, in nanoseconds.
const TAU_NS: f64 = 1e9;

/// Operations per second of one connection. 16 bytes, no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateMeter {
    rate_per_s: f64,
    last_ns: u64,
}

impl RateMeter {
    /// Counts one operation at `now_ns` and returns the updated rate.
    pub fn record(&mut self, now_ns: u64) -> f64 {
        let dt = now_ns.saturating_sub(self.last_ns) as f64;
        self.last_ns = now_ns;
        self.rate_per_s = self.rate_per_s * (-dt / TAU_NS).exp() + 1.0;
        self.rate_per_s
    }

    /// The rate as of the last operation.
    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rate_per_s: f64, seconds: f64) -> f64 {
        let mut m = RateMeter::default();
        let step = (1e9 / rate_per_s) as u64;
        let n = (rate_per_s * seconds) as u64;
        let mut last = 0.0;
        for i in 1..=n {
            last = m.record(i * step);
        }
        last
    }

    #[test]
    fn tracks_steady_rates() {
        // The average of a steady stream settles near its rate.
        let slow = run(2.0, 20.0);
        assert!((1.5..3.5).contains(&slow), "{slow}");
        let fast = run(500.0, 5.0);
        assert!((450.0..560.0).contains(&fast), "{fast}");
    }

    #[test]
    fn decays_when_idle() {
        let mut m = RateMeter::default();
        for i in 0..1000u64 {
            m.record(i * 1_000_000);
        }
        assert!(m.rate_per_s() > 500.0);
        // One operation ten seconds later: the burst is forgotten.
        assert!(m.record(11_000_000_000) < 1.1);
    }
}
