//! The PID controller (docs/design.md#pid-control): turns a process variable (memory pressure
//! and store load, see [`crate::signals`]) into a normalised delay.
//!
//! Invariants:
//! - The output is always within `[output_min, output_max]` and inside
//!   `0..=1`; it is a fraction of [`PidConfig::max_delay_ms`], so gains do not
//!   depend on the delay scale. (The ORLY plan expressed outputs in seconds. Its
//!   write tuning means the same here, the write scale being 1 s; its read
//!   gains act here on fractions of 200 ms, so the read controller is five
//!   times gentler than the plan's at the same gains.)
//! - The integral stays within `[integral_min, integral_max]`, and it grows
//!   only up to the level at which the output reaches `output_max`
//!   (conditional integration), so a long overload stores up no delay to
//!   unwind afterwards. It may stay positive for a few seconds after an
//!   overload; it drains while the process variable is below the setpoint,
//!   and with no history a process variable below the setpoint gives 0.
//! - The derivative acts on a low-pass filtered error, and the filter is seeded
//!   with the first error, so neither noise nor the first sample kicks it.
//! - No clock inside: `now_ns` comes from the caller's monotonic clock. A time
//!   that does not advance integrates nothing; a gap longer than
//!   [`MAX_DT_NS`] counts as [`MAX_DT_NS`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// Longest time step the controller integrates at once. A monitor that
/// stalled for a minute must not add a minute of error to the integral in
/// one step; five seconds is fifty ticks at the default 100 ms tick.
pub const MAX_DT_NS: u64 = 5_000_000_000;

/// Largest process variable the controller accepts; larger values (and
/// `+inf`) are clamped, NaN and negatives count as 0. This keeps one broken
/// sensor from poisoning the integral with NaN forever.
pub const MAX_PROCESS_VARIABLE: f64 = 100.0;

/// Gains, setpoint, filter and clamps of one controller.
///
/// Validated by [`PidConfig::validate`]; every constructor of [`Pid`] calls it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PidConfig {
    /// Proportional gain: output per unit of error. `>= 0`.
    pub kp: f64,
    /// Integral gain: output per unit of accumulated error-seconds. `>= 0`.
    pub ki: f64,
    /// Derivative gain: output per unit of error change per second. `>= 0`.
    pub kd: f64,
    /// Target process variable (e.g. 0.85: aim at 85% of the memory target).
    /// Above it the controller delays; well below it the output is zero.
    pub setpoint: f64,
    /// Low-pass coefficient of the derivative filter, in `(0, 1]`:
    /// `filtered = alpha * error + (1 - alpha) * filtered`. Lower smooths
    /// more; 1 disables the filter. Assumes the caller's fixed tick.
    pub derivative_alpha: f64,
    /// Lowest integral (error-seconds), `<= 0`. A little negative room lets
    /// the controller recover faster after a long quiet spell (as in the ORLY plan).
    pub integral_min: f64,
    /// Highest integral (error-seconds), `>= 0`: the anti-windup clamp.
    pub integral_max: f64,
    /// Lowest output, in `0..=output_max`. Usually 0.
    pub output_min: f64,
    /// Highest output, in `output_min..=1`. The largest delay ever applied is
    /// `output_max * max_delay_ms`; when the controller asks for more than
    /// that (raw output above `output_max`) admission refuses instead.
    pub output_max: f64,
    /// Delay at output 1.0, in milliseconds, `1..=60000`.
    pub max_delay_ms: u64,
}

impl PidConfig {
    /// Relay writes (EVENT), the ORLY plan's tuning: Kp 0.5, Ki 0.1, Kd 0.05, alpha 0.2,
    /// setpoint 0.85, integral in `[-0.5, 2.0]`, max delay 1 s.
    pub fn write_default() -> Self {
        Self {
            kp: 0.5,
            ki: 0.1,
            kd: 0.05,
            setpoint: 0.85,
            derivative_alpha: 0.2,
            integral_min: -0.5,
            integral_max: 2.0,
            output_min: 0.0,
            output_max: 1.0,
            max_delay_ms: 1000,
        }
    }

    /// Relay reads (REQ, COUNT), the ORLY plan's tuning: lighter and more responsive:
    /// Kp 0.3, Ki 0.05, Kd 0.02, alpha 0.3, setpoint 0.85, integral in
    /// `[-0.2, 1.0]`, max delay 200 ms.
    pub fn read_default() -> Self {
        Self {
            kp: 0.3,
            ki: 0.05,
            kd: 0.02,
            setpoint: 0.85,
            derivative_alpha: 0.3,
            integral_min: -0.2,
            integral_max: 1.0,
            output_min: 0.0,
            output_max: 1.0,
            max_delay_ms: 200,
        }
    }

    /// Bulk import writes, after the ORLY plan: the write tuning with a conservative
    /// setpoint of 0.70 (30% headroom for import bursts) and Ki 0.15 for the
    /// sustained load an import is.
    pub fn import_default() -> Self {
        Self {
            setpoint: 0.70,
            ki: 0.15,
            ..Self::write_default()
        }
    }

    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("kp", self.kp, 0.0, 1e6, "a finite gain >= 0")?;
        check_range("ki", self.ki, 0.0, 1e6, "a finite gain >= 0")?;
        check_range("kd", self.kd, 0.0, 1e6, "a finite gain >= 0")?;
        check_range("setpoint", self.setpoint, 1e-6, 10.0, "in (0, 10]")?;
        check_range(
            "derivative_alpha",
            self.derivative_alpha,
            1e-6,
            1.0,
            "in (0, 1]",
        )?;
        check_range("integral_min", self.integral_min, -1e6, 0.0, "<= 0")?;
        check_range("integral_max", self.integral_max, 0.0, 1e6, ">= 0")?;
        check_range("output_max", self.output_max, 0.0, 1.0, "in [0, 1]")?;
        check_range(
            "output_min",
            self.output_min,
            0.0,
            self.output_max,
            "in [0, output_max]",
        )?;
        check_range(
            "max_delay_ms",
            self.max_delay_ms as f64,
            1.0,
            60_000.0,
            "in 1..=60000",
        )?;
        Ok(())
    }

    /// The delay for a normalised output: `clamp(output, 0, 1) * max_delay`.
    pub fn delay_for(&self, output: f64) -> Duration {
        let fraction = if output.is_nan() {
            0.0
        } else {
            output.clamp(0.0, 1.0)
        };
        Duration::from_nanos((fraction * self.max_delay_ns() as f64) as u64)
    }

    /// [`PidConfig::max_delay_ms`] in nanoseconds.
    pub fn max_delay_ns(&self) -> u64 {
        self.max_delay_ms.saturating_mul(1_000_000)
    }
}

/// Everything the controller computed at its last update, for /metrics and
/// the JSON status endpoint. All zero before the first update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PidState {
    /// Process variable as used (after clamping to `0..=100`).
    pub process_variable: f64,
    /// `process_variable - setpoint`; positive means over target.
    pub error: f64,
    /// Low-pass filtered error the derivative is taken from.
    pub filtered_error: f64,
    /// Accumulated error-seconds, within the integral clamps.
    pub integral: f64,
    /// Proportional term `kp * error`.
    pub p: f64,
    /// Integral term `ki * integral`.
    pub i: f64,
    /// Derivative term `kd * d(filtered_error)/dt`.
    pub d: f64,
    /// `p + i + d` before the output clamp: what the controller asks for.
    /// Above `output_max` means "more delay than the cap": admission refuses.
    pub raw_output: f64,
    /// `raw_output` clamped to `[output_min, output_max]`.
    pub output: f64,
}

/// A PID controller with filtered derivative and anti-windup. Not shared:
/// the store monitor owns one per direction and publishes its results.
#[derive(Debug, Clone)]
pub struct Pid {
    config: PidConfig,
    /// Time of the last update; `None` until the first one (or after reset).
    last_ns: Option<u64>,
    state: PidState,
}

impl Pid {
    /// A controller in its reset state. Fails if `config` does not validate.
    pub fn new(config: PidConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            last_ns: None,
            state: PidState::default(),
        })
    }

    /// Feeds one sample and returns the new output, normalised to
    /// `[output_min, output_max]` (a fraction of the max delay).
    ///
    /// The first update after construction or [`Pid::reset`] has no time
    /// step, so it integrates nothing and has no derivative: its output is
    /// the proportional term alone.
    pub fn update(&mut self, process_variable: f64, now_ns: u64) -> f64 {
        let c = self.config;
        let pv = sanitize(process_variable);
        let error = pv - c.setpoint;
        let dt_s = self.step_seconds(now_ns);
        let p = c.kp * error;

        let (filtered_error, d) = match dt_s {
            // First sample: seed the filter with it, so no derivative kick.
            None => (error, 0.0),
            Some(dt) if dt > 0.0 => {
                let prev = self.state.filtered_error;
                let f = c.derivative_alpha * error + (1.0 - c.derivative_alpha) * prev;
                (f, c.kd * (f - prev) / dt)
            }
            // Time did not advance: nothing new to differentiate.
            Some(_) => (self.state.filtered_error, self.state.d),
        };

        let mut integral = self.state.integral;
        if let Some(dt) = dt_s {
            // Conditional integration: the integral may grow only up to
            // the level at which the output reaches its maximum. Past
            // it, more integral would not change the output now, only
            // store up delay to be unwound after the overload (windup).
            let at_max = (c.ki > 0.0).then(|| (c.output_max - p - d) / c.ki);
            integral = integrate(integral, error, dt, at_max);
        }
        // Also applies clamps a config reload may have narrowed.
        integral = integral.clamp(c.integral_min, c.integral_max);

        let i = c.ki * integral;
        let raw_output = p + i + d;
        let output = raw_output.clamp(c.output_min, c.output_max);
        self.state = PidState {
            process_variable: pv,
            error,
            filtered_error,
            integral,
            p,
            i,
            d,
            raw_output,
            output,
        };
        output
    }

    /// Clears integral, filter and time: the next update is a first update.
    pub fn reset(&mut self) {
        self.last_ns = None;
        self.state = PidState::default();
    }

    /// Replaces gains and clamps (config reload), keeping the state; the
    /// integral is clamped into the new bounds at the next update. On error
    /// the old config stays.
    pub fn set_config(&mut self, config: PidConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// The current config.
    pub fn config(&self) -> &PidConfig {
        &self.config
    }

    /// The terms and output of the last update.
    pub fn state(&self) -> &PidState {
        &self.state
    }

    /// The last output (0 before the first update).
    pub fn output(&self) -> f64 {
        self.state.output
    }

    /// The last output as a delay: `output * max_delay`.
    pub fn delay(&self) -> Duration {
        self.config.delay_for(self.state.output)
    }

    /// Seconds since the last update (capped at [`MAX_DT_NS`]), or `None`
    /// on the first update. Records `now_ns` unless time went backwards.
    fn step_seconds(&mut self, now_ns: u64) -> Option<f64> {
        let last = self.last_ns;
        if last.is_none_or(|l| now_ns > l) {
            self.last_ns = Some(now_ns);
        }
        last.map(|l| now_ns.saturating_sub(l).min(MAX_DT_NS) as f64 / 1e9)
    }
}

/// The integral after `error` held for `dt` seconds: unchanged when time
/// did not advance; a positive error grows it no higher than `at_max` (the
/// level at which the output reaches its maximum, if the integral gain
/// counts), and never lowers it.
///
/// At a `dt` or an `error` of 0 the step is 0 and the bound leaves the
/// integral as it is, so both `> 0.0` tests could be `>=`
/// (docs/testing.md#mutation-testing).
fn integrate(integral: f64, error: f64, dt: f64, at_max: Option<f64>) -> f64 {
    if dt > 0.0 {
        let candidate = integral + error * dt;
        if error > 0.0
            && let Some(at_max) = at_max
        {
            return candidate.min(integral.max(at_max));
        }
        candidate
    } else {
        integral
    }
}

/// NaN and negatives to 0, `+inf` and huge values to [`MAX_PROCESS_VARIABLE`].
pub(crate) fn sanitize(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, MAX_PROCESS_VARIABLE)
    }
}

#[cfg(test)]
mod tests;
