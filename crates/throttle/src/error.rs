//! The one error type of this crate: a configuration value out of range.
//!
//! Invariant: every constructor and `set_config` validates its config and
//! returns this error instead of panicking, so a bad reload (SIGHUP) can be
//! rejected while the running limiter keeps its old settings. Nothing on the
//! hot path returns an error: runtime inputs are clamped, never refused.

/// A throttle setting that cannot work, named by its field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("throttle setting `{field}` = {value} is invalid: {expected}")]
pub struct ConfigError {
    /// Field name as it appears in the config struct (and so in the TOML).
    pub field: &'static str,
    /// The value that was given, as f64 so one type covers every field.
    pub value: f64,
    /// What a valid value looks like, in words.
    pub expected: &'static str,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, value: f64, expected: &'static str) -> Self {
        Self {
            field,
            value,
            expected,
        }
    }
}

/// Checks `lo <= value <= hi` and that the value is finite.
pub(crate) fn check_range(
    field: &'static str,
    value: f64,
    lo: f64,
    hi: f64,
    expected: &'static str,
) -> Result<(), ConfigError> {
    if value.is_finite() && value >= lo && value <= hi {
        Ok(())
    } else {
        Err(ConfigError::new(field, value, expected))
    }
}
