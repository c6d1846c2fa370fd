use super::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_store::{Store, StoreOptions, WriteOutcome};

use crate::config::EngineConfig;
use crate::mirror_tap::Origin;
use sluice_proto::Filter;

fn start() -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        &StoreOptions {
            map_size_bytes: 64 << 20,
            max_readers: 126,
            write_map: false,
            write_map_when_alone: false,
            min_free_disk_bytes: 0,
        },
    )
    .unwrap();
    let engine = Engine::start(store, EngineConfig::default(), ThrottleConfig::default()).unwrap();
    (dir, engine)
}

/// Waits (bounded) until `done` holds.
/// Waits (boundedly) until `done` holds; the engine's unit tests share it.
pub(crate) fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn readiness_falls_when_the_writer_thread_dies() {
    let (_dir, engine) = start();
    assert_eq!(engine.health(), Ok(()));
    engine.writer.panic_for_test();
    wait_until("the writer is seen stopped", || !engine.writer.alive());
    assert_eq!(engine.health(), Err(Unready::WriterStopped));
    // Nothing can be written any more, and saying so does not hang.
    let e = engine.write_batch_blocking(vec![note()]);
    assert!(matches!(e, Err(BulkError::Closed)), "{e:?}");
    engine.shutdown();
    assert_eq!(engine.health(), Err(Unready::ShuttingDown));
}

#[test]
fn the_monitor_runs_from_start_to_shutdown() {
    let (_dir, engine) = start();
    // Started after its first tick: a verdict is published.
    assert!(engine.throttle.state().is_some());
    assert!(engine.monitor.health.running.load(Ordering::Acquire));
    let first = engine.throttle.state().map(|s| s.ticks);
    wait_until("the monitor ticks again", || {
        engine.throttle.state().map(|s| s.ticks) > first
    });
    engine.shutdown();
    // Joined: not running, and no tick after the shutdown.
    assert!(!engine.monitor.health.running.load(Ordering::Acquire));
    let last = engine.throttle.state().map(|s| s.ticks);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(engine.throttle.state().map(|s| s.ticks), last);
}

#[test]
fn bulk_batches_and_single_events_go_through_the_one_writer_in_order() {
    let (_dir, engine) = start();
    let mut live = engine.live_connect();
    let note = note();
    let everything = Filter::from_value(&serde_json::json!({})).unwrap();
    let _sub = live.subscribe(vec![everything]);
    let outcomes = engine
        .write_batch_blocking(vec![note.clone(), note.clone()])
        .unwrap();
    assert!(matches!(outcomes[0], WriteOutcome::Stored { .. }));
    assert_eq!(outcomes[1], WriteOutcome::Duplicate);
    // Stored bulk events reach live subscribers, after the commit.
    let got = live.try_recv().unwrap();
    assert_eq!(got.event.event.raw(), note.raw());
    assert!(live.try_recv().is_none());
    // A single event after it sees it stored.
    let rx = engine
        .submit(
            Arc::new(note),
            Instant::now(),
            Origin::Client,
            (true, false),
        )
        .unwrap();
    assert_eq!(rx.blocking_recv().unwrap(), Ok(WriteOutcome::Duplicate));
    assert_eq!(engine.write_batch_blocking(Vec::new()).unwrap(), vec![]);
    engine.shutdown();
}

#[test]
fn outsiders_ride_on_the_next_commit_or_their_own_after_a_wait_and_shutdown_commits_them() {
    let (_dir, engine) = start();
    let ev = |i: u8| Arc::new(Event::sign(&[i; 32], 1_700_000_000, 1, vec![], "x"));
    let batches = || engine.writer.signals.batches.load(Ordering::Relaxed);
    // Alone, an outsider's event is committed once it has waited.
    let rx = engine
        .submit(ev(1), Instant::now(), Origin::Client, (false, true))
        .unwrap();
    assert!(matches!(
        rx.blocking_recv().unwrap(),
        Ok(WriteOutcome::Stored { .. })
    ));
    // Several outsiders and then someone else's event: one commit for
    // all (the outsiders ride on it), unless their wait ran out first.
    let before = batches();
    let started = Instant::now();
    let waiting: Vec<_> = (2..6)
        .map(|i| {
            engine
                .submit(ev(i), Instant::now(), Origin::Client, (false, true))
                .unwrap()
        })
        .collect();
    let trusted = engine
        .submit(ev(9), Instant::now(), Origin::Client, (true, false))
        .unwrap();
    assert!(matches!(
        trusted.blocking_recv().unwrap(),
        Ok(WriteOutcome::Stored { .. })
    ));
    for rx in waiting {
        assert!(matches!(
            rx.blocking_recv().unwrap(),
            Ok(WriteOutcome::Stored { .. })
        ));
    }
    if started.elapsed() < writer::OUTSIDERS_WAIT {
        assert_eq!(
            batches() - before,
            1,
            "the outsiders rode on the one commit"
        );
    }
    // Waiting at shutdown: committed before the writer stops.
    let last = engine
        .submit(ev(7), Instant::now(), Origin::Client, (false, true))
        .unwrap();
    engine.shutdown();
    assert!(matches!(
        last.blocking_recv().unwrap(),
        Ok(WriteOutcome::Stored { .. })
    ));
}

#[test]
fn health_judges_each_part() {
    let ok = HealthInputs {
        shutting_down: false,
        writer_alive: true,
        monitor_running: true,
        now_ns: 10_000_000_000,
        last_tick_ns: 9_900_000_000,
        tick_ns: 100_000_000,
        stats_ok: true,
    };
    assert_eq!(judge(ok), Ok(()));
    let down = HealthInputs {
        shutting_down: true,
        ..ok
    };
    assert_eq!(judge(down), Err(Unready::ShuttingDown));
    let writer = HealthInputs {
        writer_alive: false,
        ..ok
    };
    assert_eq!(judge(writer), Err(Unready::WriterStopped));
    let monitor = HealthInputs {
        monitor_running: false,
        ..ok
    };
    assert_eq!(judge(monitor), Err(Unready::MonitorStopped));
    // Ten ticks of 100 ms is under the 2 s floor: still fine at 1.9 s.
    let late = HealthInputs {
        last_tick_ns: ok.now_ns - 1_900_000_000,
        ..ok
    };
    assert_eq!(judge(late), Ok(()));
    let stalled = HealthInputs {
        last_tick_ns: ok.now_ns - 2_500_000_000,
        ..ok
    };
    assert_eq!(judge(stalled), Err(Unready::MonitorStalled(2500)));
    // A slow tick setting: ten of its ticks.
    let slow = HealthInputs {
        tick_ns: 1_000_000_000,
        ..stalled
    };
    assert_eq!(judge(slow), Ok(()));
    let stats = HealthInputs {
        stats_ok: false,
        ..ok
    };
    assert_eq!(judge(stats), Err(Unready::StoreStats));
    assert_eq!(
        Unready::WriterStopped.to_string(),
        "writer stopped",
        "the /readyz body names it"
    );
}

/// A real event: the first line of the shared fixture.
fn note() -> Event {
    let fixture = include_str!("../../../tests/fixtures/real-events.jsonl");
    Event::parse(fixture.lines().next().unwrap()).unwrap()
}
