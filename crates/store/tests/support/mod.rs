//! What the store's test files share: a store in a temporary directory,
//! events signed by a key number, filters, and a closed store's tables
//! opened with heed itself (as a damaged disk or another build would).

#![allow(dead_code)]

use std::path::Path;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions};
use sluice_proto::{Event, Filter, hex32};
use sluice_store::{Store, StoreOptions};

pub const MAP_SIZE_BYTES: u64 = 64 << 20;

/// A 64 MiB map, no free-disk floor.
pub fn options() -> StoreOptions {
    StoreOptions {
        map_size_bytes: MAP_SIZE_BYTES,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    }
}

pub fn open_at(dir: &Path) -> Store {
    Store::open(dir, &options()).unwrap()
}

/// A store in a new temporary directory (removed with it).
pub fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_at(dir.path());
    (dir, store)
}

/// An event signed by the secret key `[key; 32]`.
pub fn ev(key: u8, created_at: u64, kind: u16, tags: &[&[&str]], content: &str) -> Event {
    let tags = tags
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
    Event::sign(&[key; 32], created_at, kind, tags, content)
}

/// The public key of `[key; 32]`, in hex.
pub fn pk(key: u8) -> String {
    hex32::encode(&sluice_proto::event::public_key_of(&[key; 32]))
}

pub fn filter(v: serde_json::Value) -> Filter {
    Filter::from_value(&v).unwrap()
}

/// Table `name` of the closed store in `dir`, opened with heed itself.
/// Close the environment after use (`prepare_for_closing`).
#[expect(
    clippy::disallowed_methods,
    reason = "opens the closed store's file with heed itself, not through a Store"
)]
fn raw_table<'a>(dir: &'a Path, name: &'a str) -> (Env, Database<'a, Bytes, Bytes>) {
    let mut eo = EnvOpenOptions::new();
    eo.map_size(MAP_SIZE_BYTES as usize).max_dbs(16);
    // SAFETY: the store that used this directory is closed; nothing else
    // maps it.
    let env = unsafe { eo.open(dir) }.unwrap();
    let wtxn = env.write_txn().unwrap();
    let db: Database<'a, Bytes, Bytes> = env
        .create_databases_and_commit(wtxn, |wdo, wtxn| -> heed::Result<_> {
            let db = wdo.create_database::<Bytes, Bytes>(wtxn, Some(name))?;
            Ok(CommitOrAbort::<_, ()>::Commit(db))
        })
        .unwrap()
        .unwrap_commit();
    (env, db)
}

/// Puts `key` → `value` in table `name` of the closed store in `dir`.
#[expect(
    clippy::disallowed_methods,
    reason = "the closed store's table, with heed itself"
)]
pub fn raw_put(dir: &Path, name: &str, key: &[u8], value: &[u8]) {
    let (env, db) = raw_table(dir, name);
    let mut wtxn = env.write_txn().unwrap();
    db.put(&mut wtxn, key, value).unwrap();
    wtxn.commit().unwrap();
    env.prepare_for_closing().wait();
}

/// Entries of table `name` of the closed store in `dir`.
#[expect(
    clippy::disallowed_methods,
    reason = "the closed store's table, with heed itself"
)]
pub fn raw_len(dir: &Path, name: &str) -> u64 {
    let (env, db) = raw_table(dir, name);
    let wtxn = env.write_txn().unwrap();
    let n = db.len(&wtxn).unwrap();
    wtxn.abort();
    env.prepare_for_closing().wait();
    n
}
