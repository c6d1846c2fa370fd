//! The admission checks every EVENT and REQ passes, as the session calls
//! them: the per-IP bucket (1,000 addresses in rotation), the controller's
//! published verdict with the connection's rate meter, and the per-author
//! bucket. The target is under 1 µs at p99 (docs/design.md#targets).
//!
//! Run: `cargo bench -p sluice-engine --bench admission`
//!
//! Criterion reports means; the p50/p99/p99.9 lines printed first come from
//! timing 1,000,000 single calls each (the two clock reads, about 20-40 ns,
//! are included, so they are upper bounds).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use criterion::{Criterion, Throughput};
use sluice_engine::limiter::Limiter;
use sluice_throttle::Principal;
use sluice_throttle::ThrottleConfig;
use sluice_throttle::admission::Op;
use sluice_throttle::trust::WriteStanding;

const ADDRESSES: u32 = 1_000;

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n % ADDRESSES))
}

/// An author in the web of trust without a tier: the author map.
const ANYONE: WriteStanding = WriteStanding::Trusted {
    distance: 1,
    tier: None,
};

fn author(n: u32) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&(n % ADDRESSES).to_be_bytes());
    k
}

/// Enforce mode with client rates high enough that every call is admitted
/// (the common path), or the shipped defaults, under which a 1,000-address
/// rotation at bench speed is refused by the buckets (the flood path).
fn throttle(admitting: bool) -> std::sync::Arc<Limiter> {
    let mut cfg = ThrottleConfig::default();
    if admitting {
        for b in [
            &mut cfg.clients.events_per_ip,
            &mut cfg.clients.events_per_pubkey,
            &mut cfg.clients.reqs_per_ip,
        ] {
            b.rate_per_s = 1e9;
        }
    }
    cfg.validate().expect("valid bench config");
    Limiter::new(cfg)
}

fn percentiles<R>(name: &str, mut f: impl FnMut(u32) -> R) {
    const N: usize = 1_000_000;
    let mut ns = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        black_box(f(i as u32));
        ns.push(t.elapsed().as_nanos() as u64);
    }
    ns.sort_unstable();
    let q = |p: f64| ns[((N as f64 * p) as usize).min(N - 1)];
    println!(
        "admission/{name}: p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns ({N} calls)",
        q(0.5),
        q(0.99),
        q(0.999),
        ns[N - 1]
    );
}

fn main() {
    for (label, admitting) in [("admitted", true), ("refused", false)] {
        let t = throttle(admitting);
        let mut conn = t.pacer();
        percentiles(&format!("admit_event {label}"), |i| {
            t.admit(Op::Event, &Principal::anonymous(ip(i)), &mut conn)
        });
        let mut conn = t.pacer();
        percentiles(&format!("admit_req {label}"), |i| {
            t.admit(Op::Request, &Principal::anonymous(ip(i)), &mut conn)
        });
        percentiles(&format!("admit_author {label}"), |i| {
            t.admit_author(&author(i), 1, &ANYONE)
        });
    }

    // Cluster mode: the same common path with each client's use counted
    // for the limits reconcile, drained every 10,000 calls as its tick does.
    let t = throttle(true);
    t.track_usage();
    let mut conn = t.pacer();
    percentiles("admit_event admitted, cluster (use counted)", |i| {
        if i % 10_000 == 0 {
            black_box(t.drain_usage());
        }
        t.admit(Op::Event, &Principal::anonymous(ip(i)), &mut conn)
    });

    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("admission");
    g.throughput(Throughput::Elements(1));
    for (label, admitting) in [("admitted", true), ("refused", false)] {
        let t = throttle(admitting);
        let mut conn = t.pacer();
        let mut i = 0u32;
        g.bench_function(format!("admit_event {label}"), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                t.admit(
                    Op::Event,
                    &Principal::anonymous(black_box(ip(i))),
                    &mut conn,
                )
            })
        });
        let mut conn = t.pacer();
        g.bench_function(format!("admit_req {label}"), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                t.admit(
                    Op::Request,
                    &Principal::anonymous(black_box(ip(i))),
                    &mut conn,
                )
            })
        });
        g.bench_function(format!("admit_author {label}"), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                t.admit_author(black_box(&author(i)), 1, &ANYONE)
            })
        });
    }
    g.finish();
    c.final_summary();
}
