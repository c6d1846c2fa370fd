//! `[search]`: what the full-text index holds.

use serde::{Deserialize, Serialize};

/// The `[search]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Whether the relay keeps a full-text index and answers NIP-50
    /// searches from it (off: a filter's `search` is checked by scanning,
    /// bounded by `engine.max_scan_rows`, and NIP-11 does not list 50).
    pub enabled: bool,
    /// Kinds whose events are indexed (and searchable).
    pub kinds: Vec<u16>,
    /// Most bytes of one event's text indexed; the rest is not searchable.
    pub max_indexed_bytes_per_event: usize,
    /// Memory the indexer's writer may buffer before it writes a segment.
    pub writer_memory_mb: usize,
    /// Longest time events wait to become searchable while the indexer is
    /// caught up (one index commit at most this often) while searches
    /// come.
    pub commit_interval_ms: u64,
    /// How often the index commits once no search has come for this long
    /// (at least `commit_interval_ms`). A search that then finds the last
    /// commit older than `commit_interval_ms`, with events stored since,
    /// first waits for a commit of them, so it finds what it would have.
    pub idle_commit_interval_ms: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            enabled: true,
            kinds: vec![0, 1, 30023],
            max_indexed_bytes_per_event: 16 * 1024,
            writer_memory_mb: 64,
            commit_interval_ms: 3000,
            idle_commit_interval_ms: 60_000,
        }
    }
}

impl SearchConfig {
    /// Checks the values, naming the first bad key as the operator writes
    /// it (`search.kinds`).
    pub fn validate(&self) -> Result<(), String> {
        if self.enabled && self.kinds.is_empty() {
            return Err("search.kinds must list at least one kind while search.enabled".into());
        }
        if !(64..=1 << 20).contains(&self.max_indexed_bytes_per_event) {
            return Err("search.max_indexed_bytes_per_event must be in 64..=1048576".into());
        }
        if !(16..=4096).contains(&self.writer_memory_mb) {
            return Err("search.writer_memory_mb must be in 16..=4096".into());
        }
        if !(10..=60_000).contains(&self.commit_interval_ms) {
            return Err("search.commit_interval_ms must be in 10..=60000".into());
        }
        if !(10..=3_600_000).contains(&self.idle_commit_interval_ms) {
            return Err("search.idle_commit_interval_ms must be in 10..=3600000".into());
        }
        Ok(())
    }

    /// How long a commit may wait while no search comes: the idle
    /// interval, never shorter than the interval while searches come.
    pub fn idle_commit_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.idle_commit_interval_ms.max(self.commit_interval_ms))
    }

    /// Whether events of `kind` are indexed.
    pub fn indexes(&self, kind: u16) -> bool {
        self.kinds.contains(&kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_errors_name_the_key() {
        assert_eq!(SearchConfig::default().validate(), Ok(()));
        let e = SearchConfig {
            kinds: vec![],
            ..SearchConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.starts_with("search.kinds"), "{e}");
        let off = SearchConfig {
            enabled: false,
            kinds: vec![],
            ..SearchConfig::default()
        };
        assert_eq!(off.validate(), Ok(()));
        for (cfg, key) in [
            (
                SearchConfig {
                    max_indexed_bytes_per_event: 1,
                    ..SearchConfig::default()
                },
                "search.max_indexed_bytes_per_event",
            ),
            (
                SearchConfig {
                    writer_memory_mb: 1,
                    ..SearchConfig::default()
                },
                "search.writer_memory_mb",
            ),
            (
                SearchConfig {
                    commit_interval_ms: 0,
                    ..SearchConfig::default()
                },
                "search.commit_interval_ms",
            ),
            (
                SearchConfig {
                    idle_commit_interval_ms: 0,
                    ..SearchConfig::default()
                },
                "search.idle_commit_interval_ms",
            ),
        ] {
            assert!(cfg.validate().unwrap_err().starts_with(key), "{key}");
        }
    }
}
