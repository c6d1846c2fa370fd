//! Wall-clock time as the engine stamps it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Current unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
