//! Names of the mirrors' metrics (docs/metrics.md lists them). Each series
//! carries `peer`: the mirrored relay's URL without credentials.

/// 1 while the mirror holds a connection to its peer, else 0.
pub const MIRROR_CONNECTED: &str = "sluice_mirror_connected";
/// Events that came from the peer, by what admission made of them
/// (`outcome`: stored, duplicate, ephemeral, shadow_rejected, refused).
pub const MIRROR_EVENTS_IN_TOTAL: &str = "sluice_mirror_events_in_total";
/// Events sent up to the peer, by its final answer (`result`: accepted,
/// duplicate, refused).
pub const MIRROR_EVENTS_OUT_TOTAL: &str = "sluice_mirror_events_out_total";
/// Seconds between the `created_at` of the last live event from the peer
/// and its arrival here.
pub const MIRROR_LAG_SECONDS: &str = "sluice_mirror_lag_seconds";
/// Connections to the peer tried again after one was lost or failed.
pub const MIRROR_RECONNECTS_TOTAL: &str = "sluice_mirror_reconnects_total";
/// A full queue (`direction`: down, reading from the peer paused while the
/// admission window is full; up, an event dropped from the queue to the
/// peer, sent by the next catch-up instead).
pub const MIRROR_QUEUE_FULL_TOTAL: &str = "sluice_mirror_queue_full_total";
/// Catch-ups at connection, by `method`: negentropy (NIP-77), or req (the
/// peer does not reconcile: a REQ since the newest event seen from it).
pub const MIRROR_CATCHUPS_TOTAL: &str = "sluice_mirror_catchups_total";
/// The pace of events sent up to the peer: the rate the uploader's AIMD
/// loop set from the peer's answers.
pub const MIRROR_UP_RATE_EVENTS_PER_SECOND: &str = "sluice_mirror_up_rate_events_per_second";
/// EVENTs sent up to the peer and awaiting its OK (0 when idle).
pub const MIRROR_UP_IN_FLIGHT: &str = "sluice_mirror_up_in_flight";
/// EVENTs sent up again (`cause`: rate_limited, the peer answered
/// `rate-limited`; reconnect, unanswered when the connection was lost).
pub const MIRROR_UP_RETRIES_TOTAL: &str = "sluice_mirror_up_retries_total";
/// EVENTs the peer refused for good, by the prefix of its answer
/// (`reason`: blocked, invalid, pow, restricted, …, other).
pub const MIRROR_UP_REFUSED_TOTAL: &str = "sluice_mirror_up_refused_total";
