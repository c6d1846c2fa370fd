//! Corrupt bytes in any table are errors that name the table, never panics,
//! and the data they do not touch is still served.
//!
//! Each test stores the fixture of real signed events (plus a few signed
//! here when a write must hit a slot of a known key), closes the store,
//! damages one table directly with heed, reopens the store and checks every
//! entry point: query, count, query steps, stats, the export walk and
//! write batches.

use std::path::Path;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, EnvOpenOptions, RwTxn};
use serde_json::json;
use sluice_proto::{Event, Filter, hex32};
use sluice_store::{
    CountCursor, QueryCursor, QueryOptions, StepLimits, Store, StoreError, StoreOptions,
    WriteOutcome,
};

const FIXTURE: &str = include_str!("../../../tests/fixtures/real-events.jsonl");

/// Just after the newest fixture event.
const NOW: u64 = 1_761_700_000;

const MAP_SIZE_BYTES: u64 = 64 << 20;

fn open(dir: &Path) -> Store {
    let opts = StoreOptions {
        map_size_bytes: MAP_SIZE_BYTES,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    Store::open(dir, &opts).unwrap()
}

fn opts() -> QueryOptions {
    QueryOptions {
        now: NOW,
        max_scan_rows: 1_000_000,
    }
}

fn filter(v: serde_json::Value) -> Filter {
    Filter::from_value(&v).unwrap()
}

/// Test key `n`'s events, signed.
fn signed(n: u8, created_at: u64, kind: u16, tags: &[&[&str]], content: &str) -> Event {
    let tags = tags
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
    Event::sign(&[n; 32], created_at, kind, tags, content)
}

fn pk_hex(e: &Event) -> String {
    hex32::encode(&e.pubkey)
}

/// A store holding the fixture and test key 1's profile (kind 0) and one
/// article (kind 30023, `d` = "post").
struct Fixture {
    dir: tempfile::TempDir,
    /// Stored events with their serials, in fixture order, then the two
    /// signed ones.
    stored: Vec<(Event, u64)>,
    /// Events in the store (older versions of replaceable events and
    /// their deletions are gone).
    events: u64,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut events: Vec<Event> = FIXTURE.lines().map(|l| Event::parse(l).unwrap()).collect();
        events.push(signed(1, NOW - 100, 0, &[], r#"{"name":"one"}"#));
        events.push(signed(1, NOW - 100, 30023, &[&["d", "post"]], "first"));
        let store = open(dir.path());
        let outcomes = store.write_batch(&events, NOW).unwrap();
        let stored = events
            .into_iter()
            .zip(outcomes)
            .filter_map(|(e, o)| match o {
                WriteOutcome::Stored { serial, .. } => Some((e, serial)),
                _ => None,
            })
            .collect();
        let events = store.stats().unwrap().events;
        store.close();
        Fixture {
            dir,
            stored,
            events,
        }
    }

    /// A stored kind-1 event and an author of other stored events.
    fn note_and_other_author(&self) -> (&(Event, u64), String) {
        let note = self.stored.iter().find(|(e, _)| e.kind == 1).unwrap();
        let other = self
            .stored
            .iter()
            .find(|(e, _)| e.pubkey != note.0.pubkey)
            .map(|(e, _)| pk_hex(e))
            .unwrap();
        (note, other)
    }

    fn profile_of_key_1(&self) -> &Event {
        &self.stored[self.stored.len() - 2].0
    }

    fn article_of_key_1(&self) -> &Event {
        &self.stored[self.stored.len() - 1].0
    }

    /// Answers of a few queries, taken before the damage.
    fn answers(&self, filters: &[serde_json::Value]) -> Vec<Vec<String>> {
        let store = open(self.dir.path());
        let out = filters
            .iter()
            .map(|f| store.query(&[filter(f.clone())], &opts()).unwrap().events)
            .collect();
        store.close();
        out
    }

    /// Runs `edit` on the raw table `name` in one committed transaction,
    /// with the store closed.
    #[expect(
        clippy::disallowed_methods,
        reason = "damages the closed store's file with heed itself, not through a Store"
    )]
    fn damage(&self, name: &str, edit: impl FnOnce(&mut RwTxn<'_>, Database<Bytes, Bytes>)) {
        let mut eo = EnvOpenOptions::new();
        eo.map_size(MAP_SIZE_BYTES as usize).max_dbs(16);
        // SAFETY: the store that used this directory is closed; nothing
        // else maps it.
        let env = unsafe { eo.open(self.dir.path()) }.unwrap();
        let wtxn = env.write_txn().unwrap();
        let db = env
            .create_databases_and_commit(wtxn, |wdo, wtxn| -> heed::Result<_> {
                let db = wdo.create_database::<Bytes, Bytes>(wtxn, Some(name))?;
                Ok(CommitOrAbort::<_, ()>::Commit(db))
            })
            .unwrap()
            .unwrap_commit();
        let mut wtxn = env.write_txn().unwrap();
        edit(&mut wtxn, db);
        wtxn.commit().unwrap();
        env.prepare_for_closing().wait();
    }

    fn reopen(&self) -> Store {
        open(self.dir.path())
    }
}

/// The table a corrupt-data error names; panics on any other result.
fn corrupt_table<T: std::fmt::Debug>(r: Result<T, StoreError>) -> &'static str {
    match r {
        Err(StoreError::Corrupt { table, .. }) => table,
        other => {
            let got: String = format!("{other:?}").chars().take(300).collect();
            panic!("expected a corrupt-data error, got {got}")
        }
    }
}

fn query(store: &Store, f: serde_json::Value) -> Result<Vec<String>, StoreError> {
    store.query(&[filter(f)], &opts()).map(|o| o.events)
}

fn count(store: &Store, f: serde_json::Value) -> Result<u64, StoreError> {
    store.count(&[filter(f)], &opts()).map(|(n, _, _)| n)
}

/// Runs a query in steps of 7 rows, as the query workers do.
fn query_in_steps(store: &Store, f: serde_json::Value) -> Result<Vec<String>, StoreError> {
    let mut cur = QueryCursor::new(vec![filter(f)], opts());
    let mut out = Vec::new();
    let limits = StepLimits {
        rows: 7,
        bytes: 4096,
    };
    while !cur.is_done() {
        store.query_step(&mut cur, limits, &mut out)?;
    }
    Ok(out)
}

fn count_in_steps(store: &Store, f: serde_json::Value) -> Result<u64, StoreError> {
    let mut cur = CountCursor::new(vec![filter(f)], opts());
    let limits = StepLimits {
        rows: 7,
        bytes: u64::MAX,
    };
    while !cur.is_done() {
        store.count_step(&mut cur, limits)?;
    }
    Ok(cur.count())
}

fn export(store: &Store) -> Result<u64, StoreError> {
    store.for_each_raw(0, u64::MAX, NOW, |_| Ok(()))
}

#[test]
fn index_key_with_a_truncated_serial_fails_the_scans_that_reach_it() {
    let fx = Fixture::new();
    let ((note, serial), other) = fx.note_and_other_author();
    let author = pk_hex(note);
    let untouched = [
        json!({"authors": [other]}),
        json!({"kinds": [note.kind]}),
        json!({"ids": [note.id_hex()]}),
    ];
    let before = fx.answers(&untouched);
    let key = [
        &note.pubkey[..],
        &note.created_at.to_be_bytes(),
        &serial.to_be_bytes(),
    ]
    .concat();
    fx.damage("by_author", |wtxn, db| {
        assert!(db.delete(wtxn, &key).unwrap());
        db.put(wtxn, &key[..key.len() - 3], &[]).unwrap();
    });
    let store = fx.reopen();

    let by_author = json!({"authors": [author]});
    assert_eq!(corrupt_table(query(&store, by_author.clone())), "by_author");
    assert_eq!(corrupt_table(count(&store, by_author.clone())), "by_author");
    assert_eq!(
        corrupt_table(query_in_steps(&store, by_author.clone())),
        "by_author"
    );
    assert_eq!(
        corrupt_table(count_in_steps(&store, by_author)),
        "by_author"
    );

    for (f, expected) in untouched.iter().zip(&before) {
        assert_eq!(&query(&store, f.clone()).unwrap(), expected, "{f}");
        assert_eq!(&query_in_steps(&store, f.clone()).unwrap(), expected, "{f}");
    }
    assert!(before[2].contains(&note.raw().to_string()));
    assert_eq!(store.stats().unwrap().events, fx.events);
    assert!(export(&store).unwrap() > 0);
    let next = signed(2, NOW - 10, 1, &[], "still writable");
    assert!(matches!(
        store.write_batch([&next], NOW).unwrap()[0],
        WriteOutcome::Stored { .. }
    ));
}

#[test]
fn created_index_key_shorter_than_time_and_serial_fails_the_export_walk() {
    let fx = Fixture::new();
    let ((note, serial), other) = fx.note_and_other_author();
    let untouched = [json!({"authors": [other]}), json!({"kinds": [1]})];
    let before = fx.answers(&untouched);
    let key = [
        &note.created_at.to_be_bytes()[..],
        &serial.to_be_bytes()[..2],
    ]
    .concat();
    fx.damage("by_created", |wtxn, db| db.put(wtxn, &key, &[]).unwrap());
    let store = fx.reopen();

    assert_eq!(corrupt_table(export(&store)), "by_created");
    assert_eq!(corrupt_table(query(&store, json!({}))), "by_created");
    assert_eq!(
        corrupt_table(count_in_steps(&store, json!({}))),
        "by_created"
    );
    for (f, expected) in untouched.iter().zip(&before) {
        assert_eq!(&query(&store, f.clone()).unwrap(), expected, "{f}");
    }
    assert_eq!(
        count(&store, json!({"kinds": [1]})).unwrap(),
        before[1].len() as u64
    );
}

#[test]
fn short_serial_in_the_ids_table_fails_lookups_and_the_deletion_that_reads_it() {
    let fx = Fixture::new();
    let ((note, _), _) = fx.note_and_other_author();
    let author = json!({"authors": [pk_hex(note)]});
    let before = fx.answers(std::slice::from_ref(&author));
    fx.damage("ids", |wtxn, db| {
        db.put(wtxn, &note.id, &[0, 0, 1]).unwrap()
    });
    let store = fx.reopen();

    assert_eq!(
        corrupt_table(query(&store, json!({"ids": [note.id_hex()]}))),
        "ids"
    );
    assert_eq!(corrupt_table(store.get(&note.id, NOW)), "ids");
    // A deletion naming the id reads its serial: the whole batch fails and
    // nothing of it is written.
    let deletion = signed(3, NOW - 5, 5, &[&["e", &note.id_hex()]], "");
    let bystander = signed(4, NOW - 5, 1, &[], "same batch");
    assert_eq!(
        corrupt_table(store.write_batch([&deletion, &bystander], NOW)),
        "ids"
    );
    assert_eq!(
        query(&store, json!({"ids": [bystander.id_hex()]})).unwrap(),
        Vec::<String>::new()
    );
    // Presence alone does not read the value.
    assert_eq!(store.contains_ids([&note.id]).unwrap(), vec![true]);
    assert_eq!(query(&store, author).unwrap(), before[0]);
    assert!(export(&store).unwrap() > 0);
}

#[test]
fn short_serial_in_the_addresses_table_fails_the_replacement() {
    let fx = Fixture::new();
    let profile = fx.profile_of_key_1().clone();
    let slot = [&profile.pubkey[..], &0u16.to_be_bytes()].concat();
    fx.damage("addresses", |wtxn, db| {
        db.put(wtxn, &slot, &[7; 5]).unwrap()
    });
    let store = fx.reopen();

    let newer = signed(1, NOW - 50, 0, &[], r#"{"name":"one, renamed"}"#);
    assert_eq!(corrupt_table(store.write_batch([&newer], NOW)), "addresses");
    let theirs = json!({"authors": [pk_hex(&profile)], "kinds": [0]});
    assert_eq!(
        query(&store, theirs).unwrap(),
        vec![profile.raw().to_string()]
    );
    let elsewhere = signed(2, NOW - 50, 0, &[], r#"{"name":"two"}"#);
    assert!(matches!(
        store.write_batch([&elsewhere], NOW).unwrap()[0],
        WriteOutcome::Stored { .. }
    ));
}

#[test]
fn short_value_in_the_address_tombstones_fails_the_write_that_reads_it() {
    let fx = Fixture::new();
    let article = fx.article_of_key_1().clone();
    let mut slot = [&article.pubkey[..], &30023u16.to_be_bytes()].concat();
    slot.extend_from_slice(&sha2_of(b"post"));
    fx.damage("address_tombstones", |wtxn, db| {
        db.put(wtxn, &slot, &[1, 2]).unwrap()
    });
    let store = fx.reopen();

    let newer = signed(1, NOW - 50, 30023, &[&["d", "post"]], "second");
    assert_eq!(
        corrupt_table(store.write_batch([&newer], NOW)),
        "address_tombstones"
    );
    let other_d = signed(1, NOW - 50, 30023, &[&["d", "other"]], "another post");
    assert!(matches!(
        store.write_batch([&other_d], NOW).unwrap()[0],
        WriteOutcome::Stored { .. }
    ));
    let theirs = json!({"authors": [pk_hex(&article)], "kinds": [30023]});
    assert_eq!(query(&store, theirs).unwrap().len(), 2);
}

#[test]
fn garbage_in_the_events_table_is_an_error_wherever_it_is_read() {
    let fx = Fixture::new();
    let ((note, note_serial), other) = fx.note_and_other_author();
    let profile = fx.profile_of_key_1().clone();
    let profile_serial = fx.stored[fx.stored.len() - 2].1;
    let untouched = [json!({"authors": [other]}), json!({"kinds": [7]})];
    let before = fx.answers(&untouched);
    fx.damage("events", |wtxn, db| {
        db.put(wtxn, &note_serial.to_be_bytes(), b"garbage")
            .unwrap();
        // A whole header, then bytes that are not UTF-8.
        let mut bad_utf8 = vec![0u8; 82];
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        db.put(wtxn, &profile_serial.to_be_bytes(), &bad_utf8)
            .unwrap();
    });
    let store = fx.reopen();

    let note_author = json!({"authors": [pk_hex(note)]});
    assert_eq!(corrupt_table(query(&store, note_author.clone())), "events");
    assert_eq!(corrupt_table(count(&store, note_author.clone())), "events");
    assert_eq!(corrupt_table(query_in_steps(&store, note_author)), "events");
    assert_eq!(corrupt_table(store.get(&note.id, NOW)), "events");
    assert_eq!(corrupt_table(export(&store)), "events");
    // Replacing a version that cannot be read would lose the comparison.
    let newer = signed(1, NOW - 50, 0, &[], r#"{"name":"one, renamed"}"#);
    assert_eq!(corrupt_table(store.write_batch([&newer], NOW)), "events");
    let theirs = json!({"authors": [pk_hex(&profile)], "kinds": [0]});
    assert_eq!(corrupt_table(query(&store, theirs)), "events");

    for (f, expected) in untouched.iter().zip(&before) {
        assert_eq!(&query(&store, f.clone()).unwrap(), expected, "{f}");
        assert_eq!(&query_in_steps(&store, f.clone()).unwrap(), expected, "{f}");
    }
    assert_eq!(store.stats().unwrap().events, fx.events);
}

#[test]
fn next_serial_of_the_wrong_length_refuses_writes_instead_of_reusing_serials() {
    let fx = Fixture::new();
    let (first, first_serial) = fx.stored[0].clone();
    assert_eq!(first_serial, 1);
    fx.damage("meta", |wtxn, db| {
        db.put(wtxn, b"next_serial", &[0, 1]).unwrap()
    });
    let store = fx.reopen();

    let next = signed(2, NOW - 10, 1, &[], "would take serial 1");
    assert_eq!(corrupt_table(store.write_batch([&next], NOW)), "meta");
    // The snapshot of every query reads it too.
    assert_eq!(corrupt_table(query(&store, json!({"kinds": [1]}))), "meta");
    assert_eq!(corrupt_table(count(&store, json!({"kinds": [1]}))), "meta");
    assert_eq!(
        store.get(&first.id, NOW).unwrap(),
        Some(first.raw().to_string())
    );
    assert_eq!(export(&store).unwrap(), fx.events);
    assert_eq!(store.stats().unwrap().events, fx.events);
}

#[test]
fn short_expiry_key_fails_the_purge() {
    let fx = Fixture::new();
    fx.damage("expiry", |wtxn, db| db.put(wtxn, &[0u8; 10], &[]).unwrap());
    let store = fx.reopen();

    assert_eq!(corrupt_table(store.purge_expired(NOW, 100)), "expiry");
    assert_eq!(export(&store).unwrap(), fx.events);
}

#[test]
fn schema_version_of_the_wrong_length_refuses_to_open() {
    let fx = Fixture::new();
    fx.damage("meta", |wtxn, db| {
        db.put(wtxn, b"schema_version", &[1]).unwrap()
    });
    let opts = StoreOptions {
        map_size_bytes: MAP_SIZE_BYTES,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let opened = Store::open(fx.dir.path(), &opts).map(|_| ());
    assert_eq!(corrupt_table(opened), "meta");
}

fn sha2_of(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}
