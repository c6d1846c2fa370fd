//! The polite clients' schedule: when each sends its REQs and EVENTs
//! (spread evenly over one period), and the events signed for it before the
//! clock starts.

use std::time::{Duration, Instant};

use sluice_proto::event::public_key_of;

use super::args::ReadfloodArgs;
use super::polite::{PoliteConfig, due_count};
use super::setup::Plan;
use crate::generate::{Spec, sign_parallel, text_of_len};
use crate::report::unix_now;
use crate::rng::Rng;
use crate::wire::Prepared;

/// One polite client's key and its events, signed before the clock starts.
pub(super) struct Identity {
    pubkey_hex: String,
    events: Vec<Prepared>,
}

pub(super) fn sign_polite(args: &ReadfloodArgs, plan: &Plan, rng: &mut Rng) -> Vec<Identity> {
    let tag = format!("sluice-bench-readflood-{}-{}", unix_now(), args.seed);
    let now = unix_now();
    let keys: Vec<[u8; 32]> = (0..args.polite_clients).map(|_| rng.secret_key()).collect();
    let mut specs = Vec::new();
    let mut counts = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let (offset, period) = event_schedule(args, i);
        let n = due_count(plan.total, offset, period);
        counts.push(n);
        specs.extend((0..n).map(|_| Spec {
            secret_key: *key,
            created_at: now,
            kind: 1,
            tags: vec![vec!["t".into(), tag.clone()]],
            content: text_of_len(rng, args.content_bytes),
        }));
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut signed = sign_parallel(specs, threads)
        .into_iter()
        .map(|e| Prepared::from_raw(e.raw()).expect("signed events have ids"));
    keys.iter()
        .zip(counts)
        .map(|(key, n)| Identity {
            pubkey_hex: hex::encode(public_key_of(key)),
            events: signed.by_ref().take(n).collect(),
        })
        .collect()
}

fn period(rate: f64) -> Option<Duration> {
    (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate))
}

/// Polite client i's first REQ and period: the clients are spread evenly over one period.
pub(super) fn req_schedule(args: &ReadfloodArgs, i: usize) -> (Duration, Option<Duration>) {
    let p = period(args.polite_req_rate);
    let offset = p.map_or(Duration::ZERO, |p| {
        p.mul_f64(i as f64 / args.polite_clients.max(1) as f64)
    });
    (offset, p)
}

/// Polite client i's first EVENT and period: half a slot after its REQs.
pub(super) fn event_schedule(args: &ReadfloodArgs, i: usize) -> (Duration, Option<Duration>) {
    let p = period(args.polite_event_rate);
    let offset = p.map_or(Duration::ZERO, |p| {
        p.mul_f64((i as f64 + 0.5) / args.polite_clients.max(1) as f64)
    });
    (offset, p)
}

pub(super) fn polite_config(
    args: &ReadfloodArgs,
    plan: &Plan,
    t0: Instant,
    i: usize,
    id: Identity,
) -> PoliteConfig {
    let (req_offset, req_period) = req_schedule(args, i);
    let (event_offset, event_period) = event_schedule(args, i);
    PoliteConfig {
        index: i,
        relay: plan.relay.clone(),
        bind: plan.bind(args.polite_addr),
        pubkey_hex: id.pubkey_hex,
        events: id.events,
        req_period,
        req_offset,
        event_period,
        event_offset,
        limit: args.polite_limit,
        timeout: Duration::from_millis(args.timeout_ms),
        t0,
        end: t0 + plan.total,
    }
}
