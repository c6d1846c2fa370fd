//! Names of the WebSocket layer's metrics, in one place.

/// Bytes of the messages the relay sent compressed, before (`plain`) and
/// after (`compressed`).
pub const DEFLATE_BYTES_TOTAL: &str = "sluice_ws_deflate_bytes_total";
/// Bytes held by the connections' compression windows.
pub const WINDOW_BYTES: &str = "sluice_ws_deflate_window_bytes";
/// Connections that got no window (the windows' bound was reached).
pub const WINDOWS_REFUSED_TOTAL: &str = "sluice_ws_deflate_windows_refused_total";
/// Compressed client messages that would inflate past the bound (closed 1009).
pub const INFLATE_TOO_LARGE_TOTAL: &str = "sluice_ws_inflate_too_large_total";
