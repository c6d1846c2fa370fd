//! Names of the engine's metrics, in one place so docs/metrics.md and the
//! registry can be checked against each other.

pub const WRITER_QUEUE_EVENTS: &str = "sluice_writer_queue_events";
pub const WRITER_QUEUE_WAIT_SECONDS: &str = "sluice_writer_queue_wait_seconds";
pub const WRITER_BATCH_EVENTS: &str = "sluice_writer_batch_events";
pub const WRITER_BATCH_CAP_EVENTS: &str = "sluice_writer_batch_cap_events";
pub const WRITER_COMMIT_SECONDS: &str = "sluice_writer_commit_seconds";
pub const WRITER_ERRORS_TOTAL: &str = "sluice_writer_errors_total";
/// Engine threads (writer, monitor) that ended in a panic.
pub const ENGINE_THREAD_PANICS_TOTAL: &str = "sluice_engine_thread_panics_total";
pub const WRITER_QUEUE_FULL_TOTAL: &str = "sluice_writer_queue_full_total";
pub const EVENTS_WRITTEN_TOTAL: &str = "sluice_events_written_total";
pub const EVENTS_PURGED_TOTAL: &str = "sluice_events_expired_purged_total";
pub const LIVE_PUBLISHED_TOTAL: &str = "sluice_live_published_total";
pub const LIVE_SUBSCRIPTIONS: &str = "sluice_live_subscriptions";
pub const LIVE_CANDIDATES_TOTAL: &str = "sluice_live_candidates_total";
pub const LIVE_QUEUED_TOTAL: &str = "sluice_live_queued_total";
pub const LIVE_QUEUE_FULL_TOTAL: &str = "sluice_live_queue_full_total";
pub const LIVE_MATCH_SECONDS: &str = "sluice_live_match_seconds";
pub const QUERY_SECONDS: &str = "sluice_query_seconds";
pub const QUERY_ROWS_SCANNED_TOTAL: &str = "sluice_query_rows_scanned_total";
pub const QUERY_TRUNCATED_TOTAL: &str = "sluice_query_truncated_total";
pub const STORE_MAP_SIZE_BYTES: &str = "sluice_store_map_size_bytes";
pub const STORE_USED_BYTES: &str = "sluice_store_used_bytes";
pub const STORE_FILE_BYTES: &str = "sluice_store_file_bytes";
pub const STORE_DISK_FREE_BYTES: &str = "sluice_store_disk_free_bytes";
pub const STORE_DISK_TOTAL_BYTES: &str = "sluice_store_disk_total_bytes";
pub const STORE_DISK_MIN_FREE_BYTES: &str = "sluice_store_disk_min_free_bytes";
/// Retention's size target (0: none).
pub const RETENTION_TARGET_BYTES: &str = "sluice_retention_target_bytes";
/// Events removed by retention, by rule (its index, or `size`).
pub const RETENTION_DELETED_TOTAL: &str = "sluice_retention_deleted_total";
/// Time of each retention step on the writer thread.
pub const RETENTION_STEP_SECONDS: &str = "sluice_retention_step_seconds";
pub const RETENTION_ERRORS_TOTAL: &str = "sluice_retention_errors_total";
/// Events removed by NIP-62 requests to vanish.
pub const EVENTS_VANISHED_TOTAL: &str = "sluice_events_vanished_total";
pub const STORE_EVENTS: &str = "sluice_store_events";
pub const STORE_READERS_IN_USE: &str = "sluice_store_readers_in_use";
pub const STORE_READERS_MAX: &str = "sluice_store_readers_max";
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "sluice_process_resident_memory_bytes";
pub const PROCESS_ANONYMOUS_MEMORY_BYTES: &str = "sluice_process_anonymous_memory_bytes";
pub const PROCESS_OPEN_FDS: &str = "sluice_process_open_fds";
pub const PROCESS_HEAP_RETURNED_TOTAL: &str = "sluice_process_heap_returned_total";
pub const THROTTLE_MODE: &str = "sluice_throttle_mode";
pub const THROTTLE_MEMORY_PRESSURE_RATIO: &str = "sluice_throttle_memory_pressure_ratio";
pub const THROTTLE_LOAD_LEVEL_RATIO: &str = "sluice_throttle_load_level_ratio";
pub const THROTTLE_SIGNAL_RATIO: &str = "sluice_throttle_signal_ratio";
pub const THROTTLE_PROCESS_VARIABLE_RATIO: &str = "sluice_throttle_process_variable_ratio";
pub const THROTTLE_SETPOINT_RATIO: &str = "sluice_throttle_setpoint_ratio";
pub const THROTTLE_PID_TERM: &str = "sluice_throttle_pid_term";
pub const THROTTLE_OUTPUT_RATIO: &str = "sluice_throttle_output_ratio";
pub const THROTTLE_DELAY_SECONDS: &str = "sluice_throttle_delay_seconds";
pub const THROTTLE_EMERGENCY: &str = "sluice_throttle_emergency";
pub const THROTTLE_EMERGENCY_ENTERED_TOTAL: &str = "sluice_throttle_emergency_entered_total";
pub const THROTTLE_DECISIONS_TOTAL: &str = "sluice_throttle_decisions_total";
/// Histogram of delays applied; its `_sum` is the total delay time.
pub const THROTTLE_DELAY_APPLIED_SECONDS: &str = "sluice_throttle_delay_applied_seconds";
pub const THROTTLE_REFUSALS_TOTAL: &str = "sluice_throttle_refusals_total";
pub const THROTTLE_TARGET_MEMORY_BYTES: &str = "sluice_throttle_target_memory_bytes";
pub const THROTTLE_BUCKET_KEYS: &str = "sluice_throttle_bucket_keys";
pub const THROTTLE_BUCKET_EVICTIONS_TOTAL: &str = "sluice_throttle_bucket_evictions_total";
pub const THROTTLE_RELIEF_TOTAL: &str = "sluice_throttle_relief_total";
/// Operations admitted with a budget of `[[throttle.budgets]]` on their
/// path, by budget.
pub const THROTTLE_BUDGET_ADMITTED_TOTAL: &str = "sluice_throttle_budget_admitted_total";
/// Operations a budget refused, by budget.
pub const THROTTLE_BUDGET_REFUSED_TOTAL: &str = "sluice_throttle_budget_refused_total";
/// Admits beyond a budget's own rate, lent by its parent.
pub const THROTTLE_BUDGET_BORROWED_TOTAL: &str = "sluice_throttle_budget_borrowed_total";
/// A budget's own tokens (negative: debt).
pub const THROTTLE_BUDGET_TOKENS: &str = "sluice_throttle_budget_tokens";
/// A budget's guaranteed rate and its ceiling (`limit`).
pub const THROTTLE_BUDGET_OPERATIONS_PER_SECOND: &str =
    "sluice_throttle_budget_operations_per_second";
/// Queries with a step running now (at most `throttle.queries.slots`).
pub const QUERY_WINDOW_IN_FLIGHT: &str = "sluice_query_window_in_flight";
/// Queries waiting for a step (first or next).
pub const QUERY_WINDOW_QUEUED: &str = "sluice_query_window_queued";
pub const QUERY_OPEN: &str = "sluice_query_open";
/// Estimated cost units of the open queries (what the window's bounds weigh).
pub const QUERY_OPEN_UNITS: &str = "sluice_query_open_units";
pub const QUERY_PARKED: &str = "sluice_query_parked";
pub const QUERY_CLIENTS: &str = "sluice_query_clients";
pub const QUERY_CLIENTS_WAITING: &str = "sluice_query_clients_waiting";
pub const QUERY_STEP_SECONDS: &str = "sluice_query_step_seconds";
pub const QUERY_WAIT_SECONDS: &str = "sluice_query_wait_seconds";
pub const QUERY_STEPS_TOTAL: &str = "sluice_query_steps_total";
pub const QUERY_NEW_FLOW_STEPS_TOTAL: &str = "sluice_query_new_flow_steps_total";
pub const QUERY_ADMITTED_TOTAL: &str = "sluice_query_admitted_total";
pub const QUERY_CANCELLED_TOTAL: &str = "sluice_query_cancelled_total";
pub const QUERY_COST_UNITS_TOTAL: &str = "sluice_query_cost_units_total";
pub const QUERY_SENT_BYTES_TOTAL: &str = "sluice_query_sent_bytes_total";
/// Stored events returned by query steps (REQ answers).
pub const QUERY_EVENTS_TOTAL: &str = "sluice_query_events_total";
pub const QUERY_ANSWERS_DROPPED_TOTAL: &str = "sluice_query_answers_dropped_total";
pub const QUERY_READ_BUDGET_RATE: &str = "sluice_query_read_budget_units_per_second";
/// Events the write-policy plugin decided, by result (`accept`, `reject`,
/// `shadow_reject`, `timeout`, `queue_full`, `unavailable`).
pub const PLUGIN_EVENTS_TOTAL: &str = "sluice_plugin_events_total";
/// Restarts of the write-policy plugin.
pub const PLUGIN_RESTARTS_TOTAL: &str = "sluice_plugin_restarts_total";
/// Events sent to the plugin and not yet answered.
pub const PLUGIN_IN_FLIGHT: &str = "sluice_plugin_in_flight";
/// Time from sending an event to the plugin to its answer.
pub const PLUGIN_LATENCY_SECONDS: &str = "sluice_plugin_latency_seconds";
/// Client events not replicated to the cluster: the publisher's channel
/// was full (or closed), by reason.
pub const CLUSTER_OUTBOUND_DROPPED_TOTAL: &str = "sluice_cluster_outbound_dropped_total";
/// The difficulty an outsider's note must carry now (NIP-13).
pub const POW_DIFFICULTY: &str = "sluice_pow_difficulty";
/// Pubkeys in the web of trust.
pub const TRUST_PUBKEYS: &str = "sluice_trust_pubkeys";
/// 1 while the graph stopped at `trust.max_pubkeys`.
pub const TRUST_TRUNCATED: &str = "sluice_trust_truncated";
pub const TRUST_RECOMPUTES_TOTAL: &str = "sluice_trust_recomputes_total";
pub const TRUST_FEED_OVERFLOWS_TOTAL: &str = "sluice_trust_feed_overflows_total";
