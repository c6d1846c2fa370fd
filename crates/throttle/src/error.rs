//! The one error type of this crate: a configuration value out of range.
//!
//! Invariant: every constructor and `set_config` validates its config and
//! returns this error instead of panicking, so a bad reload (SIGHUP) can be
//! rejected while the running limiter keeps its old settings. Nothing on the
//! hot path returns an error: runtime inputs are clamped, never refused.
//!
//! A sub-section's `validate` names its own fields (`kp`); the section that
//! holds it prefixes its key with [`ConfigError::within`], so the error of
//! [`crate::ThrottleConfig::validate`] names the key as the operator writes
//! it: `throttle.read.kp`.

use std::borrow::Cow;

/// A throttle setting that cannot work, named by its key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key} = {value} is invalid: must be {expected}")]
pub struct ConfigError {
    /// Dotted key, relative to the section that was validated (`kp`,
    /// `read.kp`, `throttle.read.kp`).
    pub key: String,
    /// The value that was given, as f64 so one type covers every field.
    pub value: f64,
    /// What a valid value looks like, in words (after "must be").
    pub expected: Cow<'static, str>,
}

impl ConfigError {
    pub(crate) fn new(key: &str, value: f64, expected: impl Into<Cow<'static, str>>) -> Self {
        Self {
            key: key.to_string(),
            value,
            expected: expected.into(),
        }
    }

    /// The same error, its key inside `section` (`read` + `kp` = `read.kp`).
    pub fn within(mut self, section: &str) -> Self {
        self.key = format!("{section}.{}", self.key);
        self
    }
}

/// Checks `lo <= value <= hi` and that the value is finite.
pub(crate) fn check_range(
    key: &str,
    value: f64,
    lo: f64,
    hi: f64,
    expected: &'static str,
) -> Result<(), ConfigError> {
    if value.is_finite() && value >= lo && value <= hi {
        Ok(())
    } else {
        Err(ConfigError::new(key, value, expected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_and_the_message_names_the_whole_key() {
        let e = check_range("kp", -1.0, 0.0, 1.0, "in 0..=1")
            .unwrap_err()
            .within("read")
            .within("throttle");
        assert_eq!(e.key, "throttle.read.kp");
        assert_eq!(
            e.to_string(),
            "throttle.read.kp = -1 is invalid: must be in 0..=1"
        );
        assert!(check_range("kp", f64::NAN, 0.0, 1.0, "").is_err());
        assert!(check_range("kp", 1.0, 0.0, 1.0, "").is_ok());
    }
}
