//! `sluice reindex`: builds the NIP-50 index (`store.path/search/`) again
//! from the whole store, with `[search]` as configured. Run it while the
//! relay is stopped (the index's writer lock refuses it otherwise), after
//! changing `search.kinds` or `search.max_indexed_bytes_per_event`, or
//! when the index was lost. An index this build cannot read is removed
//! first.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use sluice_search::{INDEX_DIR, Indexer, SearchIndex};

use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct ReindexArgs {
    /// TOML configuration file (the store path and `[search]` of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: ReindexArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    crate::telemetry::init_logging(&cfg.log);
    if !cfg.search.enabled {
        bail!("search.enabled is false: there is no index to build");
    }
    if !cfg.store.path.join("data.mdb").exists() {
        bail!("no store at {}", cfg.store.path.display());
    }
    let store = cfg.store.open()?;
    let dir = cfg.store.path.join(INDEX_DIR);
    let index = match SearchIndex::open(&dir, cfg.search.clone()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!(
                "sluice: the index in {} cannot be read ({e}): removing it",
                dir.display()
            );
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            SearchIndex::open(&dir, cfg.search.clone())?
        }
    };
    let started = Instant::now();
    let indexer = Indexer::rebuild(index.clone(), store.clone())
        .context("taking the index's writer (is a relay running on this store?)")?;
    let next = store.next_serial()?;
    let done = indexer.wait_caught_up(next);
    indexer.stop();
    if !done {
        bail!("the indexer stopped before the end (see the log)");
    }
    let secs = started.elapsed().as_secs_f64();
    let events = store.stats().map(|s| s.events).unwrap_or(0);
    eprintln!(
        "reindexed {events} stored events in {secs:.1} s ({:.0} events/s); index {} MB, store {} MB",
        events as f64 / secs.max(1e-9),
        index.disk_bytes() >> 20,
        std::fs::metadata(cfg.store.path.join("data.mdb"))
            .map(|m| m.len() >> 20)
            .unwrap_or(0),
    );
    drop(index);
    store.close();
    Ok(())
}
