//! A time zero shared between processes: wall-clock milliseconds, and the
//! `Instant` they stand for here.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `Instant` of a wall-clock time, for a time zero shared between processes.
pub(crate) fn instant_at_unix_ms(ms: u64) -> Instant {
    let (now_ms, now) = (unix_ms_now(), Instant::now());
    if ms >= now_ms {
        now + Duration::from_millis(ms - now_ms)
    } else {
        now.checked_sub(Duration::from_millis(now_ms - ms))
            .unwrap_or(now)
    }
}
