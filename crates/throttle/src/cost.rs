//! What a query costs, in *cost units*
//! (docs/design.md#cost-based-fair-queuing).
//!
//! One unit is one index row read (with the event it points at), and every
//! `bytes_per_unit` bytes of answer sent is one more. Before a query runs,
//! its cost is estimated from the plan the store would use, described as a
//! [`FilterShape`] per filter (the store knows plans; this crate knows
//! nothing of Nostr): an id lookup costs a row per id; an index range costs
//! the rows its limit lets it return, or, when each range is one key's
//! events (an author, a tag value), `rows_per_key` per range if that is
//! fewer (most keys hold few events: a lookup is cheap whatever its limit
//! says); times `post_filter_rows_per_match` when the index does not
//! answer every condition (rows read and dropped), never more than the
//! scan budget; a COUNT is estimated at `count_estimate_rows`. The estimate is charged to the client's read
//! budget when the query is admitted and settled as it runs with
//! [`CostConfig::actual`] of the rows it really read and the bytes it
//! really sent: the difference is charged or refunded, so a wrong estimate
//! costs nobody but the client it belongs to.

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// The cost model's constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    /// Units every REQ or COUNT costs on top of its rows (parsing, the
    /// answer's framing, opening a read transaction), `0..=1e6`.
    pub base_units: u64,
    /// Bytes of answer that cost one unit, `1..=1e9`.
    pub bytes_per_unit: u64,
    /// Rows a filter is expected to read per row it returns when its index
    /// does not answer all its conditions, `1..=1e6`.
    pub post_filter_rows_per_match: u64,
    /// Events a filter is expected to return from each key it looks up (an
    /// author, an author and kind, a tag value) when its limit allows more,
    /// `1..=1e9`.
    pub rows_per_key: u64,
    /// Typical stored event, for the estimate of bytes sent, `0..=1e9`.
    pub estimated_event_bytes: u64,
    /// Rows a COUNT is expected to read before it has run, `0..=1e9`.
    pub count_estimate_rows: u64,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            base_units: 10,
            bytes_per_unit: 1024,
            post_filter_rows_per_match: 4,
            rows_per_key: 10,
            estimated_event_bytes: 700,
            count_estimate_rows: 1000,
        }
    }
}

/// How the store would answer one filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterShape {
    /// Looks up `ids` events by id.
    Ids { ids: u64 },
    /// Walks `prefixes` index ranges newest first, returning at most
    /// `limit` events (`None`: no limit); `keyed` when each range holds
    /// one key's events (an author, an author and kind, a tag value) rather
    /// than a whole index or a kind; `post_filter` when rows must be
    /// checked against conditions the index does not answer.
    Scan {
        prefixes: u64,
        limit: Option<u64>,
        keyed: bool,
        post_filter: bool,
    },
    /// A NIP-50 search: the full-text index walks `postings` postings (the
    /// documents holding each of its words, summed over the words) and
    /// every hit returned is read from the store, at most `limit`.
    Search { postings: u64, limit: Option<u64> },
    /// Matches nothing (an empty list in the filter, `limit: 0`).
    Empty,
}

impl CostConfig {
    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "base_units",
            self.base_units as f64,
            0.0,
            1e6,
            "in 0..=1000000",
        )?;
        check_range(
            "bytes_per_unit",
            self.bytes_per_unit as f64,
            1.0,
            1e9,
            "in 1..=1000000000",
        )?;
        check_range(
            "post_filter_rows_per_match",
            self.post_filter_rows_per_match as f64,
            1.0,
            1e6,
            "in 1..=1000000",
        )?;
        check_range(
            "rows_per_key",
            self.rows_per_key as f64,
            1.0,
            1e9,
            "in 1..=1000000000",
        )?;
        check_range(
            "estimated_event_bytes",
            self.estimated_event_bytes as f64,
            0.0,
            1e9,
            "in 0..=1000000000",
        )?;
        check_range(
            "count_estimate_rows",
            self.count_estimate_rows as f64,
            0.0,
            1e9,
            "in 0..=1000000000",
        )?;
        Ok(())
    }

    /// Estimated cost of a REQ whose filters have these shapes, when one
    /// query may read at most `max_scan_rows` rows.
    pub fn estimate_req(&self, shapes: &[FilterShape], max_scan_rows: u64) -> u64 {
        let mut rows = 0u64;
        let mut returned = 0u64;
        for s in shapes {
            let (r, n) = match *s {
                FilterShape::Ids { ids } => (ids, ids),
                FilterShape::Scan {
                    prefixes,
                    limit,
                    keyed,
                    post_filter,
                } => {
                    let mut n = limit.unwrap_or(max_scan_rows).min(max_scan_rows);
                    if keyed {
                        n = n.min(prefixes.saturating_mul(self.rows_per_key));
                    }
                    let read = if post_filter {
                        n.saturating_mul(self.post_filter_rows_per_match)
                    } else {
                        n
                    };
                    // A seek per prefix besides the rows.
                    (read.min(max_scan_rows).saturating_add(prefixes), n)
                }
                FilterShape::Search { postings, limit } => {
                    let n = limit.unwrap_or(max_scan_rows).min(max_scan_rows);
                    (postings.saturating_add(n), n)
                }
                FilterShape::Empty => (0, 0),
            };
            rows = rows.saturating_add(r);
            returned = returned.saturating_add(n);
        }
        let rows = rows.min(max_scan_rows.saturating_add(shapes.len() as u64 * 4096));
        let bytes = returned.saturating_mul(self.estimated_event_bytes);
        self.actual(rows, bytes)
    }

    /// Estimated cost of a COUNT (a search's postings count whole: its
    /// hits are all checked against the store).
    pub fn estimate_count(&self, shapes: &[FilterShape], max_count_rows: u64) -> u64 {
        let seeks: u64 = shapes
            .iter()
            .map(|s| match *s {
                FilterShape::Ids { ids } => ids,
                FilterShape::Scan { prefixes, .. } => prefixes,
                FilterShape::Search { postings, .. } => {
                    postings.saturating_mul(2).min(max_count_rows)
                }
                FilterShape::Empty => 0,
            })
            .sum();
        let rows = self
            .count_estimate_rows
            .min(max_count_rows)
            .saturating_add(seeks);
        self.actual(rows, 0)
    }

    /// Cost of work done: rows read and bytes sent, plus the base.
    pub fn actual(&self, rows: u64, bytes_sent: u64) -> u64 {
        self.base_units
            .saturating_add(rows)
            .saturating_add(bytes_sent / self.bytes_per_unit.max(1))
    }

    /// Cost of one step of work, without the base (charged once per query).
    pub fn step(&self, rows: u64, bytes_sent: u64) -> u64 {
        rows.saturating_add(bytes_sent / self.bytes_per_unit.max(1))
    }
}

#[cfg(test)]
mod tests;
