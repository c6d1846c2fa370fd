//! Where the engine keeps the NIP-50 index once `[search]` started it
//! (`crates/search`): the writer rings it after each commit, the query
//! workers search it, `/readyz` watches its indexer.

use std::sync::{Arc, OnceLock};

use sluice_search::{Indexer, SearchIndex};

/// The index and its indexer, set once.
#[derive(Default)]
pub(crate) struct SearchSlot {
    index: OnceLock<Arc<SearchIndex>>,
    indexer: OnceLock<Indexer>,
}

impl SearchSlot {
    /// The writer committed events: the indexer (if any) reads them.
    pub(crate) fn ring(&self) {
        if let Some(i) = self.index.get() {
            i.ring();
        }
    }

    pub(crate) fn index(&self) -> Option<&Arc<SearchIndex>> {
        self.index.get()
    }

    pub(crate) fn indexer(&self) -> Option<&Indexer> {
        self.indexer.get()
    }

    /// Sets the index and its running indexer; false if already set.
    pub(crate) fn set(&self, index: Arc<SearchIndex>, indexer: Indexer) -> bool {
        if self.index.set(index).is_err() {
            return false;
        }
        self.indexer.set(indexer).is_ok()
    }

    /// Stops the indexer after it committed what it has indexed.
    pub(crate) fn stop(&self) {
        if let Some(i) = self.indexer.get() {
            i.stop();
        }
    }
}
