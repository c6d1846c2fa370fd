//! Engine settings: queue and pool bounds. Validated by the binary at start-up.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Events that may wait for the writer; when full, EVENTs are refused
    /// with `rate-limited:`.
    pub writer_queue_events: usize,
    /// Most events written in one LMDB transaction.
    pub max_batch_events: usize,
    /// Most bytes of event JSON written in one LMDB transaction.
    pub max_batch_bytes: usize,
    /// A group commit of client events takes as many as commit in about
    /// this long, from the cost per event of recent commits (at least 16,
    /// at most `max_batch_events`); 0: no bound but `max_batch_events`.
    pub commit_target_ms: u64,
    /// Live events queued per connection before a slow one is dropped.
    pub live_buffer_events: usize,
    /// Bytes of live event JSON queued per connection before a slow one is
    /// dropped.
    pub live_buffer_bytes: usize,
    /// Most index entries one REQ may read.
    pub max_scan_rows: u64,
    /// Most index entries one COUNT may read.
    pub max_count_rows: u64,
    /// How often expired events are removed from disk.
    pub expiry_purge_interval_ms: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            writer_queue_events: 4096,
            max_batch_events: 1024,
            max_batch_bytes: 8 << 20,
            commit_target_ms: 20,
            live_buffer_events: 4096,
            live_buffer_bytes: 4 << 20,
            max_scan_rows: 200_000,
            max_count_rows: 2_000_000,
            expiry_purge_interval_ms: 60_000,
        }
    }
}

impl EngineConfig {
    /// Checks the values, naming the first bad key as the operator writes
    /// it (`engine.max_scan_rows`).
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            (
                "engine.writer_queue_events",
                self.writer_queue_events as u64,
            ),
            ("engine.max_batch_events", self.max_batch_events as u64),
            ("engine.max_batch_bytes", self.max_batch_bytes as u64),
            ("engine.live_buffer_events", self.live_buffer_events as u64),
            ("engine.live_buffer_bytes", self.live_buffer_bytes as u64),
            ("engine.max_scan_rows", self.max_scan_rows),
            ("engine.max_count_rows", self.max_count_rows),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.expiry_purge_interval_ms < 100 {
            return Err("engine.expiry_purge_interval_ms must be at least 100".into());
        }
        Ok(())
    }
}
