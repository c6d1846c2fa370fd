//! Names of the engine's metrics, in one place so docs/metrics.md and the
//! registry can be checked against each other.

pub const WRITER_QUEUE_EVENTS: &str = "sluice_writer_queue_events";
pub const WRITER_QUEUE_WAIT_SECONDS: &str = "sluice_writer_queue_wait_seconds";
pub const WRITER_BATCH_EVENTS: &str = "sluice_writer_batch_events";
pub const WRITER_COMMIT_SECONDS: &str = "sluice_writer_commit_seconds";
pub const WRITER_ERRORS_TOTAL: &str = "sluice_writer_errors_total";
pub const WRITER_QUEUE_FULL_TOTAL: &str = "sluice_writer_queue_full_total";
pub const EVENTS_WRITTEN_TOTAL: &str = "sluice_events_written_total";
pub const EVENTS_PURGED_TOTAL: &str = "sluice_events_expired_purged_total";
pub const LIVE_PUBLISHED_TOTAL: &str = "sluice_live_published_total";
pub const QUERY_SECONDS: &str = "sluice_query_seconds";
pub const QUERY_ROWS_SCANNED_TOTAL: &str = "sluice_query_rows_scanned_total";
pub const QUERY_TRUNCATED_TOTAL: &str = "sluice_query_truncated_total";
pub const STORE_MAP_SIZE_BYTES: &str = "sluice_store_map_size_bytes";
pub const STORE_USED_BYTES: &str = "sluice_store_used_bytes";
pub const STORE_EVENTS: &str = "sluice_store_events";
pub const STORE_READERS_IN_USE: &str = "sluice_store_readers_in_use";
pub const STORE_READERS_MAX: &str = "sluice_store_readers_max";
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "sluice_process_resident_memory_bytes";
pub const PROCESS_ANONYMOUS_MEMORY_BYTES: &str = "sluice_process_anonymous_memory_bytes";
pub const PROCESS_OPEN_FDS: &str = "sluice_process_open_fds";
