//! The planner: one index per filter (ids looked up; else author and kind,
//! author, the rarest tag, kind, or time alone, by what the filter names),
//! and the shape of a plan for cost estimates made before a query runs.

use sluice_proto::Filter;

use crate::codec::{
    MAX_INLINE_TAG_BYTES, author_kind_prefix, author_prefix, kind_prefix, tag_prefix,
};
use crate::tables::Index;

/// Most author×kind prefixes one filter may expand to before the planner
/// falls back to the author index.
const MAX_AUTHOR_KIND_PREFIXES: usize = 4096;

pub(super) enum Plan {
    Ids(Vec<[u8; 32]>),
    Scan {
        index: Index,
        prefixes: Vec<Vec<u8>>,
        /// The tag letter the index answers, so the post-filter can skip it.
        covered_tag: Option<u8>,
    },
}

pub(super) fn plan(f: &Filter) -> Plan {
    if let Some(ids) = &f.ids {
        return Plan::Ids(ids.clone());
    }
    let scan = |index, prefixes| Plan::Scan {
        index,
        prefixes,
        covered_tag: None,
    };
    // The tag condition with the fewest values, when there is one.
    let rarest_tag = f.tags.iter().min_by_key(|(_, v)| v.len());
    match (&f.authors, &f.kinds, rarest_tag) {
        (Some(a), Some(k), _) if a.len() * k.len() <= MAX_AUTHOR_KIND_PREFIXES => scan(
            Index::AuthorKind,
            a.iter()
                .flat_map(|pk| k.iter().map(move |kind| author_kind_prefix(pk, *kind)))
                .collect(),
        ),
        (Some(a), _, _) => scan(Index::Author, a.iter().map(author_prefix).collect()),
        (None, _, Some((letter, values))) => Plan::Scan {
            index: Index::Tag,
            prefixes: values.iter().map(|v| tag_prefix(*letter, v)).collect(),
            covered_tag: Some(*letter),
        },
        (None, Some(k), None) => scan(Index::Kind, k.iter().map(|k| kind_prefix(*k)).collect()),
        (None, None, None) => scan(Index::Created, vec![Vec::new()]),
    }
}

/// How the planner answers one filter: for cost estimates made before a
/// query runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanShape {
    /// Matches nothing: no row is read.
    Empty,
    /// Looks up this many ids.
    Ids(usize),
    /// Walks this many index ranges; `keyed` when each range is one key's
    /// events (an author, an author and kind, a tag value), not a whole
    /// index or a kind; `post_filter` when rows are checked against
    /// conditions the index does not answer (and may be dropped).
    Scan {
        prefixes: usize,
        keyed: bool,
        post_filter: bool,
    },
}

/// The plan of one filter, as a [`PlanShape`].
pub fn plan_shape(f: &Filter) -> PlanShape {
    if f.is_empty_match() || f.limit == Some(0) {
        return PlanShape::Empty;
    }
    match plan(f) {
        Plan::Ids(ids) => PlanShape::Ids(ids.len()),
        Plan::Scan {
            index,
            prefixes,
            covered_tag,
        } => {
            let answered_authors = matches!(index, Index::Author | Index::AuthorKind);
            let answered_kinds = matches!(index, Index::Kind | Index::AuthorKind);
            let post_filter = (f.authors.is_some() && !answered_authors)
                || (f.kinds.is_some() && !answered_kinds)
                || needs_tag_check(f, covered_tag);
            PlanShape::Scan {
                prefixes: prefixes.len(),
                keyed: matches!(index, Index::Author | Index::AuthorKind | Index::Tag),
                post_filter,
            }
        }
    }
}

/// Whether rows need their JSON parsed to check tags: some tag condition
/// is not answered by the index scanned, a filter value is long enough
/// to have been indexed by its hash, or there are search words. Decided once per scan, not per row.
pub(super) fn needs_tag_check(f: &Filter, covered_tag: Option<u8>) -> bool {
    // A NIP-50 `search` is checked on the parsed event too (a search the
    // full-text index does not answer, as when `[search]` is off, scans).
    if f.search.is_some() {
        return true;
    }
    let uncovered = f.tags.iter().any(|(l, _)| Some(*l) != covered_tag);
    let hashed = f
        .tags
        .iter()
        .any(|(_, v)| v.iter().any(|s| s.len() > MAX_INLINE_TAG_BYTES));
    uncovered || hashed
}
