//! A write the store's file cannot take: the writer answers each event of
//! the batch with why. The file size limit (`RLIMIT_FSIZE`) stands in for
//! a full disk: a write wholly past it fails with `EFBIG`, which the store
//! counts as a full disk; a write it cuts short is the `EIO` LMDB reports
//! for a short write, an I/O error while the disk has plenty of room.
//!
//! The limit is the process's: this file holds one test, so no other test
//! writes under it.

use std::sync::Arc;
use std::time::Instant;

use sluice_engine::Engine;
use sluice_engine::config::EngineConfig;
use sluice_engine::mirror_tap::Origin;
use sluice_engine::writer::BulkError;
use sluice_engine::writer::WriteError;
use sluice_engine::writer::WriteResult;
use sluice_proto::Event;
use sluice_store::Store;
use sluice_store::StoreOptions;
use sluice_store::WriteOutcome;
use sluice_throttle::ThrottleConfig;

fn set_rlimit_fsize(cur: u64, max: u64) {
    let lim = libc::rlimit {
        rlim_cur: cur,
        rlim_max: max,
    };
    // SAFETY: setrlimit reads the struct passed.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

fn rlimit_fsize() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) }, 0);
    lim
}

/// A note of test key `key`, large enough to need pages of its own.
fn event(key: u8) -> Event {
    let now = sluice_engine::clock::unix_now();
    Event::sign(&[key; 32], now - 60, 1, vec![], &"x".repeat(50_000))
}

fn write(engine: &Engine, key: u8) -> WriteResult {
    let rx = engine
        .submit(
            Arc::new(event(key)),
            Instant::now(),
            Origin::Client,
            (true, false),
        )
        .unwrap();
    rx.blocking_recv().unwrap()
}

#[test]
fn a_write_past_the_file_size_limit_is_refused_as_a_full_disk() {
    let saved = rlimit_fsize();
    if saved.rlim_max != libc::RLIM_INFINITY {
        eprintln!("hard file size limit {}: not checked", saved.rlim_max);
        return;
    }
    // A file that outgrows the limit is EFBIG, not a signal.
    // SAFETY: ignoring SIGXFSZ installs no handler.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 64 << 20,
        min_free_disk_bytes: 0,
        ..StoreOptions::default()
    };
    let store = Store::open(dir.path(), &opts).unwrap();
    let engine = Engine::start(store, EngineConfig::default(), ThrottleConfig::default()).unwrap();
    assert!(matches!(write(&engine, 1), Ok(WriteOutcome::Stored { .. })));
    let len = std::fs::metadata(dir.path().join("data.mdb"))
        .unwrap()
        .len();

    // The batch's new pages start at the file's end: cut short 100 bytes
    // past it, an I/O error (the disk has room, so not a full disk).
    set_rlimit_fsize(len + 100, saved.rlim_max);
    let short = write(&engine, 2);
    // Past the two meta pages, no data page can be written: a full disk,
    // for a single event and for a bulk batch.
    set_rlimit_fsize(8192, saved.rlim_max);
    let past = write(&engine, 3);
    let bulk = engine.write_batch_blocking(vec![event(4)]);
    set_rlimit_fsize(saved.rlim_cur, saved.rlim_max);
    // Room again: the same write goes through.
    let again = write(&engine, 3);
    engine.shutdown();

    match short {
        Err(WriteError::Store(e)) => assert!(e.contains("Input/output error"), "{e}"),
        other => panic!("{other:?}"),
    }
    match past {
        Err(WriteError::DiskFull(e)) => assert!(e.contains("File too large"), "{e}"),
        other => panic!("{other:?}"),
    }
    match bulk {
        Err(BulkError::Store(e)) => assert!(e.is_disk_full(), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(again, Ok(WriteOutcome::Stored { .. })),
        "{again:?}"
    );
}
