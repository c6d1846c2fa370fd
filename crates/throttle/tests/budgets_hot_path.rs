//! The budget tree's admission allocates nothing (tests/hot_path.rs's
//! counting allocator, per thread): the routing of a charge and the walk
//! up its path, admitted, borrowed or refused.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice_throttle::BudgetTree;
use sluice_throttle::budgets::{AuthorClass, BudgetConfig, Charge, Counted};
use sluice_throttle::tiers::TiersConfig;

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
