//! Names of the mirrors' metrics (docs/metrics.md lists them). Each series
//! carries `peer`: the mirrored relay's URL without credentials.

/// 1 while the mirror holds a connection to its peer, else 0.
pub const MIRROR_CONNECTED: &str = "sluice_mirror_connected";
/// Events that came from the peer, by what admission made of them
/// (`outcome`: stored, duplicate, ephemeral, shadow_rejected, refused).
pub const MIRROR_EVENTS_IN_TOTAL: &str = "sluice_mirror_events_in_total";
/// Events sent up to the peer, by its OK (`result`: accepted, refused).
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
