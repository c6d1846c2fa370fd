//! How fresh the index is kept. While searches come, the indexer commits
//! every `search.commit_interval_ms`; once none has come for
//! `search.idle_commit_interval_ms`, only that often (a commit writes a
//! segment: files, fsyncs, tantivy's indexing thread started again, which
//! nobody needs while nobody searches). A search that finds the last
//! commit older than `commit_interval_ms` with events stored since first
//! waits, at most [`FRESH_WAIT`], for the indexer to commit what the store
//! holds, so every search sees at least what the short interval would
//! have shown it. While the indexer catches up (a restart, a large sync) a
//! search does not wait: the index lags by more than an interval then
//! anyway (docs/protocol.md).

use std::time::{Duration, Instant};

use tantivy::Searcher;

use crate::index::{Pending, SearchIndex};
use crate::metrics_names as m;

/// Longest a search waits for a commit; then it searches the index as it
/// is (the indexer is slow, or its commit failed).
pub const FRESH_WAIT: Duration = Duration::from_secs(2);

impl SearchIndex {
    /// A searcher for a search about to run (a query keeps it for its
    /// life, so its pages rank the same documents). Waits first, at most
    /// [`FRESH_WAIT`], while the index is stale: its last commit older
    /// than `commit_interval_ms` and events stored since, the indexer
    /// caught up.
    pub fn fresh_searcher(&self) -> Searcher {
        let now = Instant::now();
        let mut p = self.lock();
        let was_searched = self.searched_lately(&p, now);
        p.searched_at = Some(now);
        let interval = Duration::from_millis(self.cfg.commit_interval_ms);
        let stale = p.commit_near()
            && p.covered < p.rings
            && p.committed_at
                .is_none_or(|t| now.duration_since(t) >= interval);
        if stale {
            let want = p.rings;
            drop(p);
            let _waiting = Waiting::new(self);
            let until = now + FRESH_WAIT;
            let mut p = self.lock();
            while p.covered < want && p.commit_near() {
                if self.fresh.wait_until(&mut p, until).timed_out() {
                    break;
                }
            }
            let outcome = if p.covered >= want {
                "committed"
            } else {
                "gave_up"
            };
            drop(p);
            metrics::counter!(m::SEARCH_FRESH_WAITS_TOTAL, "outcome" => outcome).increment(1);
        } else if !was_searched {
            drop(p);
            // An indexer sleeping out the idle interval commits every
            // commit interval again.
            self.wake.notify_all();
        }
        self.reader.searcher()
    }

    /// Whether a search came within the idle interval: the indexer commits
    /// every `commit_interval_ms` only then.
    pub(crate) fn searched_lately(&self, p: &Pending, now: Instant) -> bool {
        p.searched_at
            .is_some_and(|t| now.duration_since(t) < self.cfg.idle_commit_interval())
    }

    /// The interval the indexer commits at while caught up: the idle one
    /// while no search came lately.
    pub(crate) fn commit_every(&self, idle: bool) -> Duration {
        if idle {
            self.cfg.idle_commit_interval()
        } else {
            Duration::from_millis(self.cfg.commit_interval_ms)
        }
    }

    /// The index holds what the store had at ring `rings` (committed, or
    /// nothing to commit): the searches waiting for it go on.
    pub(crate) fn covered(&self, rings: u64) {
        let mut p = self.lock();
        if rings > p.covered {
            p.covered = rings;
            drop(p);
            self.fresh.notify_all();
        }
    }

    /// The indexer thread started or ended (a search waits only for a
    /// running one); what it had not committed counts as unread.
    pub(crate) fn set_running(&self, running: bool) {
        let mut p = self.lock();
        p.running = running;
        if running {
            // The store may hold events the index has not read: the first
            // stale search waits for the indexer's first commit.
            p.rings += 1;
            p.committed_at = None;
        }
        drop(p);
        self.fresh.notify_all();
    }

    /// Whether the indexer is catching up; becoming so lets the searches
    /// waiting for it go on.
    pub(crate) fn set_behind(&self, behind: bool) {
        let mut p = self.lock();
        let became = behind && !p.behind;
        p.behind = behind;
        drop(p);
        if became {
            self.fresh.notify_all();
        }
    }

    /// The index committed: searches begun later than `commit_interval_ms`
    /// from now wait for the next one only if events are stored meanwhile.
    pub(crate) fn committed_now(&self) {
        self.lock().committed_at = Some(Instant::now());
    }
}

/// One thread waiting for the index (a search finding it stale, or
/// `Indexer::wait_caught_up`), counted in the index's `waiters` until it
/// returns, however: while any wait, the indexer commits what it reads at
/// once.
pub(crate) struct Waiting<'a>(&'a SearchIndex);

impl<'a> Waiting<'a> {
    pub(crate) fn new(index: &'a SearchIndex) -> Waiting<'a> {
        index.lock().waiters += 1;
        // An indexer sleeping out its commit interval looks again.
        index.wake.notify_all();
        Waiting(index)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().waiters -= 1;
    }
}
