//! `sluice reindex`: builds the NIP-50 index (`store.path/search/`) again
//! from the whole store, with `[search]` as configured. Run it while the
//! relay is stopped (the index's writer lock refuses it otherwise), after
//! changing `search.kinds` or `search.max_indexed_bytes_per_event`, or
//! when the index was lost. An index this build cannot read is removed
//! first.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use sluice_search::{INDEX_DIR, Indexer, SearchIndex, Workers};

use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct ReindexArgs {
    /// TOML configuration file (the store path and `[search]` of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Build nothing: print how far the index is (the store serial its
    /// last commit covers, against the store's last) and its size. Safe
    /// beside a running relay.
    #[arg(long)]
    status: bool,
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
    if args.status {
        let result = status(&store, &dir, &cfg.search);
        store.close();
        return result;
    }
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
    let indexer = Indexer::rebuild(index.clone(), store.clone(), Workers::Cores)
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

/// `--status`: the index's committed serial against the store's last.
fn status(
    store: &sluice_store::Store,
    dir: &std::path::Path,
    cfg: &sluice_search::SearchConfig,
) -> anyhow::Result<()> {
    let last = store.next_serial()?.saturating_sub(1);
    if !dir.join("meta.json").exists() {
        println!(
            "no search index in {}; the store's last serial is {last} (`sluice reindex` builds it)",
            dir.display()
        );
        return Ok(());
    }
    let index = SearchIndex::open(dir, cfg.clone())
        .with_context(|| format!("reading the index in {}", dir.display()))?;
    let (covered, version) = index.committed()?;
    let behind = last.saturating_sub(covered);
    println!(
        "search index in {}: covers serials up to {covered}; the store's last is {last}: {}; index {} bytes{}",
        dir.display(),
        if behind == 0 {
            "caught up".to_owned()
        } else {
            format!("{behind} serials behind")
        },
        index.disk_bytes(),
        if covered > 0 && version != sluice_proto::search::TOKENS_VERSION {
            format!(
                "; its words were split by an older build (version {version}): the relay's start or `sluice reindex` rebuilds it"
            )
        } else {
            String::new()
        }
    );
    Ok(())
}
