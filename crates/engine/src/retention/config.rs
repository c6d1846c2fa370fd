//! `[retention]`: the size target and the rules, as the operator writes them.

use serde::{Deserialize, Serialize};
use sluice_proto::hex32;

/// `[retention]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Size target of the store's used bytes, MiB; 0: none.
    pub max_store_mb: u64,
    /// Once over the target, events go until the store is under this
    /// fraction of it.
    pub low_watermark: f64,
    /// Age and per-author rules.
    pub rules: Vec<RetentionRuleConfig>,
    /// Hex pubkeys whose events no rule removes (admins and listed tiers
    /// are added by the binary).
    pub exempt_pubkeys: Vec<String>,
    /// How often the age rules run, seconds.
    pub interval_secs: u64,
    /// Most events one retention step removes (one transaction between
    /// client batches).
    pub step_events: usize,
    /// Most milliseconds one retention step runs (it stops there, whatever
    /// it picked).
    pub step_ms: u64,
}

/// One `[[retention.rules]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionRuleConfig {
    /// Kinds the rule covers; empty: every kind (current versions of
    /// replaceable and addressable events only when named).
    #[serde(default)]
    pub kinds: Vec<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_per_author: Option<u64>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            max_store_mb: 0,
            low_watermark: 0.9,
            rules: Vec::new(),
            exempt_pubkeys: Vec::new(),
            interval_secs: 60,
            step_events: 500,
            step_ms: 10,
        }
    }
}

impl RetentionConfig {
    /// Checks the values, naming the first bad key as the operator writes
    /// it (`retention.rules[0].max_age_secs`).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.low_watermark > 0.0 && self.low_watermark < 1.0) {
            return Err("retention.low_watermark must be between 0 and 1 (exclusive)".into());
        }
        if self.interval_secs == 0 {
            return Err("retention.interval_secs must be at least 1".into());
        }
        if self.step_events == 0 {
            return Err("retention.step_events must be at least 1".into());
        }
        if self.step_ms == 0 {
            return Err("retention.step_ms must be at least 1".into());
        }
        for (i, p) in self.exempt_pubkeys.iter().enumerate() {
            if hex32::decode::<32>(p).is_none() {
                return Err(format!(
                    "retention.exempt_pubkeys[{i}]: {p:?} is not 64 hex characters"
                ));
            }
        }
        for (i, r) in self.rules.iter().enumerate() {
            if r.max_age_secs.is_none() && r.keep_per_author.is_none() {
                return Err(format!(
                    "retention.rules[{i}]: give max_age_secs, keep_per_author or both"
                ));
            }
            if r.max_age_secs == Some(0) {
                return Err(format!(
                    "retention.rules[{i}].max_age_secs must be at least 1"
                ));
            }
            if r.keep_per_author == Some(0) {
                return Err(format!(
                    "retention.rules[{i}].keep_per_author must be at least 1"
                ));
            }
        }
        Ok(())
    }

    /// The NIP-11 `retention` field: one entry per rule (`kinds` when it
    /// names some, `time` for its age limit, `count` for its per-author
    /// limit). Empty when no rule is set.
    pub fn nip11(&self) -> Vec<serde_json::Value> {
        self.rules
            .iter()
            .map(|r| {
                let mut o = serde_json::Map::new();
                if !r.kinds.is_empty() {
                    o.insert("kinds".into(), serde_json::json!(r.kinds));
                }
                if let Some(t) = r.max_age_secs {
                    o.insert("time".into(), t.into());
                }
                if let Some(c) = r.keep_per_author {
                    o.insert("count".into(), c.into());
                }
                serde_json::Value::Object(o)
            })
            .collect()
    }
}
