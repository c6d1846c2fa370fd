//! NIP-01 filters: parsing with clear errors, and matching against events.
//!
//! Lists are kept sorted and deduplicated so matching is a binary search and
//! the store's planner can walk them in index order. An empty list matches
//! nothing. Tag values are compared as strings; the store encodes them for
//! its index (see `TagValue`).

use serde_json::{Map, Value};

use crate::search::{MAX_SEARCH_BYTES, Search};
use crate::{Event, hex32};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("filter must be a JSON object")]
    NotAnObject,
    #[error("malformed filter: {0}")]
    Malformed(String),
    #[error("filter nests deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("{0} must be an array")]
    NotAnArray(String),
    #[error("{field} must contain 64-character lowercase hex strings")]
    BadHex { field: &'static str },
    #[error("kinds must contain integers 0-65535")]
    BadKind,
    #[error("{0} must be a non-negative integer")]
    BadInteger(&'static str),
    #[error("tag filter {0} must contain strings")]
    BadTagValue(String),
    #[error("unsupported filter field {0}: only single-letter tag filters are indexed")]
    UnsupportedTag(String),
    #[error("search must be a string of at most {max} bytes")]
    BadSearch { max: usize },
    #[error("filter lists at most {max} values per field, {field} has {count}")]
    TooManyValues {
        field: String,
        count: usize,
        max: usize,
    },
}

/// Largest number of values accepted in one filter field: a bound on the
/// work one filter can ask of the planner.
pub const MAX_VALUES_PER_FIELD: usize = 1000;

/// A parsed NIP-01 filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub ids: Option<Vec<[u8; 32]>>,
    pub authors: Option<Vec<[u8; 32]>>,
    pub kinds: Option<Vec<u16>>,
    /// `(letter, values)`, sorted by letter; values sorted and deduplicated.
    pub tags: Vec<(u8, Vec<String>)>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub limit: Option<u64>,
    /// NIP-50: the words (and extensions) of `search`; an event matches
    /// only if its searchable text contains every word
    /// ([`crate::search`]).
    pub search: Option<Box<Search>>,
}

/// How the store's index encodes one tag value; exposed here so the store
/// and any tool agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagValue<'a> {
    /// 64 lowercase hex characters (event ids, pubkeys): kept as 32 bytes.
    Hex32([u8; 32]),
    /// Anything else.
    Text(&'a str),
}

impl<'a> TagValue<'a> {
    pub fn classify(value: &'a str) -> TagValue<'a> {
        match hex32::decode::<32>(value) {
            Some(b) => TagValue::Hex32(b),
            None => TagValue::Text(value),
        }
    }
}

/// Deepest nesting a filter may have (the object, a list).
pub const MAX_FILTER_DEPTH: usize = 2;

impl Filter {
    /// Parses one filter from its JSON text: deeper nesting than
    /// [`MAX_FILTER_DEPTH`] and JSON the parser refuses (numbers out of
    /// range among them) are reported as such, not as "not an object".
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        if crate::event::nests_deeper_than(text, MAX_FILTER_DEPTH) {
            return Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH,
            });
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| FilterError::Malformed(crate::event::short_serde_error(&e)))?;
        Filter::from_value(&v)
    }

    /// Parses one filter object.
    pub fn from_value(v: &Value) -> Result<Filter, FilterError> {
        let obj = v.as_object().ok_or(FilterError::NotAnObject)?;
        Self::from_map(obj)
    }

    fn from_map(obj: &Map<String, Value>) -> Result<Filter, FilterError> {
        let mut f = Filter::default();
        for (key, val) in obj {
            match key.as_str() {
                "ids" => f.ids = Some(hex_list(val, "ids")?),
                "authors" => f.authors = Some(hex_list(val, "authors")?),
                "kinds" => f.kinds = Some(kind_list(val)?),
                "since" => f.since = Some(uint(val, "since")?),
                "until" => f.until = Some(uint(val, "until")?),
                "limit" => f.limit = Some(uint(val, "limit")?),
                k if k.starts_with('#') => {
                    let name = &k.as_bytes()[1..];
                    if name.len() != 1 || !name[0].is_ascii_alphabetic() {
                        return Err(FilterError::UnsupportedTag(k.to_owned()));
                    }
                    f.tags.push((name[0], tag_list(val, k)?));
                }
                "search" => f.search = Some(Box::new(search(val)?)),
                // Unknown fields (others this relay does not implement)
                // are ignored, as NIP-01 relays commonly do.
                _ => {}
            }
        }
        f.tags.sort_by_key(|(letter, _)| *letter);
        Ok(f)
    }

    /// True when the filter can match nothing at all (an empty list, or
    /// since after until), so no store work is needed.
    pub fn is_empty_match(&self) -> bool {
        self.ids.as_ref().is_some_and(Vec::is_empty)
            || self.authors.as_ref().is_some_and(Vec::is_empty)
            || self.kinds.as_ref().is_some_and(Vec::is_empty)
            || self.tags.iter().any(|(_, v)| v.is_empty())
            || matches!((self.since, self.until), (Some(s), Some(u)) if s > u)
    }

    /// NIP-01 matching: every present condition must hold.
    pub fn matches(&self, ev: &Event) -> bool {
        self.matches_time(ev.created_at)
            && self
                .ids
                .as_ref()
                .is_none_or(|ids| ids.binary_search(&ev.id).is_ok())
            && self
                .authors
                .as_ref()
                .is_none_or(|a| a.binary_search(&ev.pubkey).is_ok())
            && self
                .kinds
                .as_ref()
                .is_none_or(|k| k.binary_search(&ev.kind).is_ok())
            && self.tags.iter().all(|(letter, values)| {
                ev.indexed_tags().any(|(l, v)| {
                    l == *letter && values.binary_search_by(|x| x.as_str().cmp(v)).is_ok()
                })
            })
            && self.search.as_ref().is_none_or(|s| s.matches(ev))
    }

    /// since/until, both inclusive.
    pub fn matches_time(&self, created_at: u64) -> bool {
        self.since.is_none_or(|s| created_at >= s) && self.until.is_none_or(|u| created_at <= u)
    }
}

fn array<'v>(val: &'v Value, field: &str) -> Result<&'v Vec<Value>, FilterError> {
    let arr = val
        .as_array()
        .ok_or_else(|| FilterError::NotAnArray(field.to_owned()))?;
    if arr.len() > MAX_VALUES_PER_FIELD {
        return Err(FilterError::TooManyValues {
            field: field.to_owned(),
            count: arr.len(),
            max: MAX_VALUES_PER_FIELD,
        });
    }
    Ok(arr)
}

fn hex_list(val: &Value, field: &'static str) -> Result<Vec<[u8; 32]>, FilterError> {
    let mut out = array(val, field)?
        .iter()
        .map(|v| {
            v.as_str()
                .and_then(hex32::decode::<32>)
                .ok_or(FilterError::BadHex { field })
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn kind_list(val: &Value) -> Result<Vec<u16>, FilterError> {
    let mut out = array(val, "kinds")?
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|k| u16::try_from(k).ok())
                .ok_or(FilterError::BadKind)
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn tag_list(val: &Value, field: &str) -> Result<Vec<String>, FilterError> {
    let mut out = array(val, field)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| FilterError::BadTagValue(field.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn search(val: &Value) -> Result<Search, FilterError> {
    match val.as_str() {
        Some(text) if text.len() <= MAX_SEARCH_BYTES => Ok(Search::parse(text)),
        _ => Err(FilterError::BadSearch {
            max: MAX_SEARCH_BYTES,
        }),
    }
}

fn uint(val: &Value, field: &'static str) -> Result<u64, FilterError> {
    val.as_u64().ok_or(FilterError::BadInteger(field))
}

#[cfg(test)]
mod tests;
