//! `sluice compact OUT`: a compacted, consistent copy of the store in
//! `OUT/data.mdb`, taken while a relay serves (or not).
//!
//! It opens the store named by the configuration (`store.path`, with the
//! relay's `map_size_mb`, `max_readers` and `write_map`: every process on
//! one store must agree on `write_map`) and runs LMDB's compacting copy
//! ([`Store::compact_to`](sluice_store::Store::compact_to)): the store as of
//! one read transaction, without its free pages, so the copy is also how to
//! reclaim the space deletions left in the file. Writers go on meanwhile;
//! the copy holds one reader slot until it ends. An existing `OUT/data.mdb`
//! is never overwritten.

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use sluice_store::StoreError;

use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct CompactArgs {
    /// Directory to write the copy in (as OUT/data.mdb); created if
    /// missing. Refused when OUT/data.mdb exists.
    out: PathBuf,
    /// TOML configuration file (the store path is that of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: CompactArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    crate::telemetry::init_logging(&cfg.log);
    let source = cfg.store.path.join("data.mdb");
    if !source.exists() {
        bail!("no store at {}", cfg.store.path.display());
    }
    let target = args.out.join("data.mdb");
    if target.exists() {
        bail!(
            "{} already exists: give a new or empty directory",
            target.display()
        );
    }
    let store = cfg.store.open()?;
    let started = Instant::now();
    let copied = store.compact_to(&args.out);
    let stats = store.stats();
    store.close();
    let copy_bytes = match copied {
        Ok(n) => n,
        Err(StoreError::Io(e)) if e.kind() == io::ErrorKind::AlreadyExists => {
            bail!("{} already exists", target.display())
        }
        Err(e) => {
            return Err(e).with_context(|| format!("copying the store to {}", target.display()));
        }
    };
    let source_bytes = std::fs::metadata(&source)
        .with_context(|| format!("reading the size of {}", source.display()))?
        .len();
    let stats = stats.context("reading the store's statistics")?;
    println!(
        "source {}: {source_bytes} bytes ({} in use, {} events)",
        source.display(),
        stats.used_bytes,
        stats.events
    );
    println!("copy   {}: {copy_bytes} bytes", target.display());
    eprintln!("compact: done in {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}
