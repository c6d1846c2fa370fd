//! Names of the search index's metrics, in one place so docs/metrics.md
//! and the registry can be checked against each other.

/// Highest store serial the index has committed (every event up to it is
/// indexed or was not indexable).
pub const SEARCH_INDEXED_SERIAL: &str = "sluice_search_indexed_serial";
/// Events stored but not yet searchable (the indexer's lag).
pub const SEARCH_LAG_EVENTS: &str = "sluice_search_lag_events";
/// Documents added to the index.
pub const SEARCH_DOCUMENTS_TOTAL: &str = "sluice_search_documents_total";
/// Documents removed from the index because the store no longer holds
/// their event.
pub const SEARCH_REMOVED_TOTAL: &str = "sluice_search_removed_total";
/// Removals dropped because the indexer's queue of them was full (a later
/// search finds them again).
pub const SEARCH_REMOVALS_DROPPED_TOTAL: &str = "sluice_search_removals_dropped_total";
/// Index commits, and how long each took.
pub const SEARCH_COMMIT_SECONDS: &str = "sluice_search_commit_seconds";
/// Indexer errors (store reads, index writes); the indexer retries.
pub const SEARCH_ERRORS_TOTAL: &str = "sluice_search_errors_total";
/// Size of the index directory on disk.
pub const SEARCH_INDEX_BYTES: &str = "sluice_search_index_bytes";
/// Postings the searches walked (documents per word, summed).
pub const SEARCH_POSTINGS_TOTAL: &str = "sluice_search_postings_total";
/// Search hits dropped at the store's check, by why: `gone` (the store no
/// longer holds the event) or `unmatched` (the rest of the filter, expiry
/// or the reader's rights).
pub const SEARCH_HITS_DROPPED_TOTAL: &str = "sluice_search_hits_dropped_total";
/// Searches that found the index stale (its last commit older than
/// `commit_interval_ms`, events stored since) and waited for a commit, by
/// how the wait ended: `committed`, or `gave_up` (2 s passed, or the
/// indexer turned out to be catching up or stopped).
pub const SEARCH_FRESH_WAITS_TOTAL: &str = "sluice_search_fresh_waits_total";
