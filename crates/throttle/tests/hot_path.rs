//! The admission hot path allocates nothing: a counting global allocator
//! (per thread, so parallel tests do not disturb each other) checks the
//! calls the engine makes per operation. Cost in time is for a benchmark,
//! not a test; allocation is the part a test can assert exactly.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use sluice_throttle::budgets::{AuthorClass, BudgetConfig, Charge, Counted};
use sluice_throttle::tiers::TiersConfig;
use sluice_throttle::{
    AfterStep, BucketConfig, BudgetTree, Cause, DelayBatcher, FairQueue, KeyedBuckets, Mode,
    QueriesConfig, TokenBucket, Verdict, scaled_rate,
};

struct Counting;

thread_local! {
    // Const-initialised and without a destructor: safe to touch from
    // inside the allocator.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn delay_batching_does_not_allocate() {
    let published = [
        Verdict::Allow.to_bits(),
        Verdict::Delay(Duration::from_millis(30)).to_bits(),
        Verdict::refuse(Cause::OverCap, Duration::from_secs(1)).to_bits(),
    ];
    let mut batcher = DelayBatcher::new(10);
    let mut refused = 0u32;
    let n = allocations_in(|| {
        for k in 0..100_000usize {
            let v = Verdict::from_bits(published[k % 3]);
            let mode = Mode::from_u8((k % 2) as u8);
            if batcher.check(mode, v).action().is_refuse() {
                refused += 1;
            }
        }
    });
    assert_eq!(n, 0);
    assert!(refused > 0);
}

#[test]
fn bucket_checks_do_not_allocate() {
    let mut bucket = TokenBucket::new(BucketConfig::default(), 0).unwrap();
    let mut keyed = KeyedBuckets::new(BucketConfig::default(), 1000).unwrap();
    // Warm up: the keys exist, the map is at its bound.
    for k in 0..1000u32 {
        let _ = keyed.check(&k, 0, 1);
    }
    let n = allocations_in(|| {
        for k in 0..100_000u64 {
            let now = k * 1_000;
            let _ = bucket.try_take(now, 1);
            let _ = keyed.check(&((k % 1000) as u32), now, 1);
            if k % 1000 == 0 {
                keyed.set_rate(scaled_rate(10.0, (k % 7) as f64 / 7.0, 0.1));
            }
        }
    });
    assert_eq!(n, 0, "existing keys never allocate");
    // New keys at a full map reuse the evicted slot in place; the table may
    // still rehash now and then, so only bound it.
    let n = allocations_in(|| {
        for k in 1000..101_000u32 {
            let _ = keyed.check(&k, 1_000_000_000, 1);
        }
    });
    assert!(n <= 100, "evictions allocated {n} times");
    assert_eq!(keyed.len(), 1000);
}

#[test]
fn scheduler_decisions_do_not_allocate_once_warm() {
    let mut q: FairQueue<u32> = FairQueue::new(QueriesConfig::default()).unwrap();
    let cycle = |q: &mut FairQueue<u32>, i: u64| {
        let a = q.submit((i % 4) as u32, i % 4, 850, i).unwrap();
        let b = q.submit(((i + 1) % 4) as u32, (i + 1) % 4, 27, i).unwrap();
        // a takes two steps (queued again after the first), b one.
        let mut a_steps = 0;
        while let Some(id) = q.dispatch_next() {
            let after = if id == a && a_steps == 0 {
                a_steps += 1;
                AfterStep::Continue
            } else {
                AfterStep::Finished
            };
            q.step_done(id, 100, 1_000_000, after);
        }
        q.cancel(a);
        q.cancel(b);
        let _ = q.expire(i);
        q.unpark(i % 4);
    };
    for i in 0..1000 {
        cycle(&mut q, i);
    }
    let n = allocations_in(|| {
        for i in 1000..101_000 {
            cycle(&mut q, i);
        }
    });
    assert_eq!(n, 0, "the scheduler allocated {n} times");
    assert!(q.is_idle());
}

/// The policy over per-address and per-pubkey maps, as the engine runs it
/// per EVENT and REQ (no metrics here): nothing allocated once the keys
/// are known, whatever the verdict.
#[test]
fn admission_policy_does_not_allocate() {
    use std::net::IpAddr;

    use sluice_throttle::admission::{Action, Admission, Bucket, Buckets, Op, Tally};
    use sluice_throttle::trust::{OutsiderRule, WriteStanding};
    use sluice_throttle::{
        ConnPacer, Direction, Layer, OutsiderWrites, Principal, RateLimited, ThrottleConfig, Tiers,
        TiersConfig,
    };

    struct Maps {
        ips: KeyedBuckets<IpAddr>,
        pubkeys: KeyedBuckets<[u8; 32]>,
    }
    impl Buckets for Maps {
        fn take(&mut self, b: Bucket<'_>, cost: u32, now: u64) -> Result<(), Duration> {
            match b {
                Bucket::Address(_, ip) => self.ips.check(&ip, now, cost),
                Bucket::Pubkey(_, _, p) | Bucket::Author(p) | Bucket::AuthorKind(_, p) => {
                    self.pubkeys.check(p, now, cost)
                }
                Bucket::Outsiders => Ok(()),
            }
        }
        fn settle(&mut self, _: Bucket<'_>, _: i64, _: u64) {}
    }
    struct Count(u64);
    impl Tally for Count {
        fn decision(&mut self, _: Direction, _: Layer, _: Action, _: bool) {
            self.0 += 1;
        }
        fn refused(&mut self, _: Direction, _: &RateLimited) {}
        fn delayed(&mut self, _: Direction, _: Duration) {}
        fn connection_refused(&mut self) {}
    }

    let config = ThrottleConfig::default();
    let tiers = Tiers::new(&TiersConfig::default());
    let who: Vec<Principal> = (0..100u8)
        .map(|i| {
            let ip = IpAddr::from([192, 0, 2, i]);
            if i.is_multiple_of(2) {
                tiers.principal(ip, &[[i; 32]])
            } else {
                tiers.principal(ip, &[])
            }
        })
        .collect();
    let mut maps = Maps {
        ips: KeyedBuckets::new(BucketConfig::default(), 1000).unwrap(),
        pubkeys: KeyedBuckets::new(BucketConfig::default(), 1000).unwrap(),
    };
    let mut count = Count(0);
    let published = [
        Verdict::Allow,
        Verdict::Delay(Duration::from_millis(30)),
        Verdict::refuse(Cause::OverCap, Duration::from_secs(1)),
    ];
    let mut pacer = ConnPacer::new(10);
    // A trusted author, and an outsider in `limited` (the shared budget).
    let standing = [
        WriteStanding::Trusted {
            distance: 1,
            tier: None,
        },
        WriteStanding::Outsider(OutsiderRule {
            writes: OutsiderWrites::Limited,
            floor: 0,
            current: 0,
            adaptive: false,
        }),
    ];
    let mut run = |k: u64, maps: &mut Maps, count: &mut Count| {
        let mut c = Admission {
            config: &config,
            buckets: maps,
            tally: count,
            now_ns: k * 100_000,
        };
        let op = if k.is_multiple_of(2) {
            Op::Event
        } else {
            Op::Request
        };
        let who = &who[(k % 100) as usize];
        c.operation(op, who, &mut pacer, published[(k % 3) as usize]);
        let standing = &standing[(k % 2) as usize];
        let _ = c.outsiders(standing, 0);
        let _ = c.author(&[(k % 100) as u8; 32], 1, standing);
    };
    for k in 0..1000 {
        run(k, &mut maps, &mut count);
    }
    let n = allocations_in(|| {
        for k in 1000..101_000 {
            run(k, &mut maps, &mut count);
        }
    });
    assert_eq!(n, 0, "admission allocated {n} times");
    assert!(count.0 > 0, "some decisions were made");
}

/// The budget tree's admission: the routing of a charge and the walk up
/// its path, admitted, borrowed or refused.
#[test]
fn a_budget_tree_admits_and_refuses_without_allocating() {
    let budget = |name: &str, class: Option<&str>, (rate, ceil): (f64, f64)| BudgetConfig {
        name: name.into(),
        parent: None,
        class: class.map(str::to_owned),
        rate_per_s: rate,
        burst: Some(rate),
        ceil_per_s: Some(ceil),
        counts: vec![Counted::Events],
    };
    let budgets = [
        budget("relay", None, (300.0, 300.0)),
        budget("anonymous", Some("anonymous"), (100.0, 300.0)),
        budget("authenticated", Some("authenticated"), (200.0, 200.0)),
    ];
    let mut tree = BudgetTree::new(&budgets, &TiersConfig::default(), 50.0, 0).unwrap();
    let routing = tree.routing();
    let charges = [0u8, 1].map(|tier| Charge::Connection {
        counted: Counted::Events,
        tier,
        author: AuthorClass::None,
    });
    let (mut admitted, mut refused) = (0u32, 0u32);
    let n = allocations_in(|| {
        for i in 0..10_000u64 {
            for charge in charges {
                let Some((node, counted)) = routing.node(charge) else {
                    continue;
                };
                match tree.admit(node, counted, 1, i * 100_000) {
                    Ok(()) => admitted += 1,
                    Err(_) => refused += 1,
                }
            }
            let _ = routing.node(Charge::Outsider);
        }
    });
    assert_eq!(n, 0);
    assert!(admitted > 0 && refused > 0, "{admitted} {refused}");
}
