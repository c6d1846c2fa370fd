//! The governor: one tick of the global control loop, composed from the
//! other modules. The engine's store monitor samples memory and
//! [`LoadSignals`] every tick and calls [`Governor::tick`]; it then publishes
//! the two verdicts (e.g. `Verdict::to_bits` in atomics) for the hot path
//! and the [`GovernorState`] for /metrics and the status endpoint.
//!
//! Per tick: memory pressure = anonymous bytes / target; load level = the
//! largest normalised signal; process variable = weighted sum of the two;
//! emergency flag re-evaluated from memory pressure; the write and read PID
//! controllers updated with the same process variable (they differ in
//! tuning, docs/design.md#pid-control); one verdict per direction.
//!
//! Invariants: the governor owns no clock and no thread; the state it
//! reports is exactly what produced the verdicts; the controllers keep
//! updating during emergency mode, so they are warm (and, with conditional
//! integration, not wound up) when it ends.

use serde::{Deserialize, Serialize};

use crate::config::ThrottleConfig;
use crate::emergency::Emergency;
use crate::error::ConfigError;
use crate::pid::{Pid, PidConfig, PidState};
use crate::signals::{LoadSignals, NormalizedSignals, memory_pressure, process_variable};
use crate::verdict::{Direction, Verdict};

/// One direction's controller after a tick.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DirectionState {
    /// The controller's terms and output.
    pub pid: PidState,
    /// The controller's setpoint.
    pub setpoint: f64,
    /// `output * max_delay`, ns: the delay a `Delay` verdict carries (also
    /// reported when refusing, to show how far past the cap it is).
    pub delay_ns: u64,
    /// What admission publishes for this direction.
    pub verdict: Verdict,
}

/// Everything one tick computed, for /metrics and `GET /api/throttle`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GovernorState {
    /// Time of the tick (caller's monotonic clock), ns.
    pub now_ns: u64,
    /// Ticks since the governor was created.
    pub ticks: u64,
    /// Anonymous memory sampled, bytes.
    pub memory_bytes: u64,
    /// `memory_bytes / target`.
    pub memory_pressure: f64,
    /// Each load signal, normalised.
    pub signals: NormalizedSignals,
    /// The largest normalised signal.
    pub load_level: f64,
    /// `memory_weight * memory_pressure + load_weight * load_level`.
    pub process_variable: f64,
    /// Emergency mode is on.
    pub emergency: bool,
    /// Times emergency mode was entered.
    pub emergency_entered_total: u64,
    /// Write controller and verdict.
    pub write: DirectionState,
    /// Read controller and verdict.
    pub read: DirectionState,
}

/// The global control loop. See the module docs.
#[derive(Debug, Clone)]
pub struct Governor {
    config: ThrottleConfig,
    write: Pid,
    read: Pid,
    emergency: Emergency,
    state: GovernorState,
}

impl Governor {
    /// A governor that allows everything until its first tick. Fails on an
    /// invalid config.
    pub fn new(config: ThrottleConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let write = Pid::new(config.write)?;
        let read = Pid::new(config.read)?;
        let idle = |c: &PidConfig| DirectionState {
            pid: PidState::default(),
            setpoint: c.setpoint,
            delay_ns: 0,
            verdict: Verdict::Allow,
        };
        let state = GovernorState {
            now_ns: 0,
            ticks: 0,
            memory_bytes: 0,
            memory_pressure: 0.0,
            signals: NormalizedSignals::default(),
            load_level: 0.0,
            process_variable: 0.0,
            emergency: false,
            emergency_entered_total: 0,
            write: idle(&config.write),
            read: idle(&config.read),
        };
        Ok(Self {
            emergency: Emergency::new(config.emergency)?,
            config,
            write,
            read,
            state,
        })
    }

    /// Runs one tick with this tick's samples and returns its results.
    pub fn tick(
        &mut self,
        anon_memory_bytes: u64,
        signals: &LoadSignals,
        now_ns: u64,
    ) -> &GovernorState {
        let c = &self.config;
        let memory = memory_pressure(anon_memory_bytes, c.target_memory_bytes());
        let normalized = NormalizedSignals::from_raw(signals, &c.signals);
        let load = normalized.load_level();
        let pv = process_variable(memory, load, c.memory_weight, c.load_weight);
        let emergency = self.emergency.update(memory);
        let retry = emergency.then(|| c.emergency.retry_after());
        self.write.update(pv, now_ns);
        self.read.update(pv, now_ns);
        self.state = GovernorState {
            now_ns,
            ticks: self.state.ticks + 1,
            memory_bytes: anon_memory_bytes,
            memory_pressure: memory,
            signals: normalized,
            load_level: load,
            process_variable: pv,
            emergency,
            emergency_entered_total: self.emergency.entered_total(),
            write: direction_state(&self.write, retry),
            read: direction_state(&self.read, retry),
        };
        &self.state
    }

    /// The results of the last tick.
    pub fn state(&self) -> &GovernorState {
        &self.state
    }

    /// The last verdict for `direction`.
    pub fn verdict(&self, direction: Direction) -> Verdict {
        match direction {
            Direction::Write => self.state.write.verdict,
            Direction::Read => self.state.read.verdict,
        }
    }

    /// The current config.
    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// Applies a new config (SIGHUP reload), keeping controller state; the
    /// next tick uses it. On error nothing changes.
    pub fn set_config(&mut self, config: ThrottleConfig) -> Result<(), ConfigError> {
        config.validate()?;
        // Validated as a whole above, so the parts cannot fail.
        self.write.set_config(config.write)?;
        self.read.set_config(config.read)?;
        self.emergency.set_config(config.emergency)?;
        self.config = config;
        Ok(())
    }

    /// Resets both controllers (integral, filter, time), e.g. after the
    /// store was swapped. The emergency flag is kept: it follows memory.
    pub fn reset(&mut self) {
        self.write.reset();
        self.read.reset();
    }
}

fn direction_state(pid: &Pid, emergency_retry: Option<std::time::Duration>) -> DirectionState {
    let config = pid.config();
    DirectionState {
        pid: *pid.state(),
        setpoint: config.setpoint,
        delay_ns: u64::try_from(pid.delay().as_nanos()).unwrap_or(u64::MAX),
        verdict: Verdict::from_controller(pid.state(), config, emergency_retry),
    }
}

#[cfg(test)]
mod tests;
