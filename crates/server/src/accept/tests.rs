use super::*;

fn limits(max: usize, max_per_ip: usize, queue_per_ip: usize, queue_total: usize) -> SlotLimits {
    SlotLimits {
        max,
        max_per_ip,
        queue_per_ip,
        queue_total,
    }
}

fn now(a: Result<SlotGrant, SlotRefused>) -> HttpSlot {
    match a {
        Ok(SlotGrant::Now(slot)) => slot,
        Ok(SlotGrant::Wait(_)) => panic!("queued, expected a slot"),
        Err(e) => panic!("refused {e:?}, expected a slot"),
    }
}

fn queued(a: Result<SlotGrant, SlotRefused>) -> Waiting {
    match a {
        Ok(SlotGrant::Wait(w)) => w,
        Ok(SlotGrant::Now(_)) => panic!("a slot, expected to wait"),
        Err(e) => panic!("refused {e:?}, expected to wait"),
    }
}

fn refused(a: Result<SlotGrant, SlotRefused>) -> SlotRefused {
    match a {
        Err(e) => e,
        Ok(_) => panic!("admitted, expected a refusal"),
    }
}

fn assert_idle(slots: &HttpSlots) {
    let st = slots.state.lock();
    assert_eq!(st.open, 0);
    assert_eq!(st.waiting_total, 0);
    assert!(st.per_ip.is_empty() && st.by_age.is_empty() && st.waiting.is_empty());
}

#[test]
fn slots_are_bounded_in_all_and_per_address_and_given_back_on_drop() {
    // No queue: past the address's cap is refused at once.
    let slots = HttpSlots::new(limits(3, 2, 0, 0));
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let b: IpAddr = "10.0.0.2".parse().unwrap();
    let a1 = now(slots.take(a, true));
    let a2 = now(slots.take(a, true));
    assert_eq!(refused(slots.take(a, true)), SlotRefused::QueueFull);
    let proxy = now(slots.take(a, false));
    assert_eq!(refused(slots.take(b, true)), SlotRefused::Total);
    drop(a1);
    let b1 = now(slots.take(b, true));
    drop((a2, proxy, b1));
    assert_idle(&slots);
}

#[test]
fn at_the_cap_the_oldest_slot_past_the_eviction_age_makes_room() {
    let slots = HttpSlots::new(limits(2, 10, 4, 4));
    let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
    let old = now(slots.take(ip(1), true));
    let young = now(slots.take(ip(2), true));
    // Nobody is old enough yet: refused.
    assert_eq!(refused(slots.take(ip(3), true)), SlotRefused::Total);
    // Age the first slot past the eviction age.
    {
        let mut st = slots.state.lock();
        let entry = st.by_age.get_mut(&old.id).unwrap();
        entry.0 -= EVICT_AFTER;
    }
    let new = now(slots.take(ip(3), true));
    assert!(old.evicted.is_cancelled(), "the oldest is told to close");
    assert!(!young.evicted.is_cancelled());
    // Its connection ends and gives the slot back.
    drop((old, young, new));
    assert_idle(&slots);
}

#[test]
fn past_its_cap_an_address_waits_and_its_freed_slots_go_to_its_oldest_waiter() {
    let slots = HttpSlots::new(limits(100, 2, 3, 4));
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let b: IpAddr = "10.0.0.2".parse().unwrap();
    let a1 = now(slots.take(a, true));
    let a2 = now(slots.take(a, true));
    let mut w1 = queued(slots.take(a, true));
    let mut w2 = queued(slots.take(a, true));
    let w3 = queued(slots.take(a, true));
    // The address's queue is full; another address still gets a slot.
    assert_eq!(refused(slots.take(a, true)), SlotRefused::QueueFull);
    let b1 = now(slots.take(b, true));
    let b2 = now(slots.take(b, true));
    let wb = queued(slots.take(b, true));
    // Nothing is handed over while the address's slots are held.
    assert!(w1.slot.try_recv().is_err());
    // The total queue (4) is full now: b waits no more.
    assert_eq!(refused(slots.take(b, true)), SlotRefused::QueueFull);
    // a's slot frees: its oldest waiter gets it, counted as before.
    drop(a1);
    let got1 = w1.slot.try_recv().expect("the oldest waiter's slot");
    assert!(w2.slot.try_recv().is_err());
    {
        let st = slots.state.lock();
        assert_eq!(st.per_ip[&a], 2);
        assert_eq!(st.waiting_total, 3);
    }
    // A waiter that leaves gives its place up; the next slot skips it.
    drop(w2);
    drop(a2);
    let mut w3 = w3;
    let got3 = w3.slot.try_recv().expect("the next waiter's slot");
    drop((w1, w3, got1, got3, wb, b1, b2));
    assert_idle(&slots);
}

#[test]
fn a_slot_handed_to_a_waiter_that_never_takes_it_goes_back() {
    let slots = HttpSlots::new(limits(10, 1, 2, 2));
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let a1 = now(slots.take(a, true));
    let w1 = queued(slots.take(a, true));
    let mut w2 = queued(slots.take(a, true));
    // The slot reaches w1's channel; w1 then leaves without reading
    // it: the slot passes on to w2.
    drop(a1);
    drop(w1);
    let got = w2.slot.try_recv().expect("passed on");
    drop((w2, got));
    assert_idle(&slots);
}

#[test]
fn a_waiter_held_back_by_the_total_cap_is_served_when_any_slot_frees() {
    let slots = HttpSlots::new(limits(2, 1, 2, 2));
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let b: IpAddr = "10.0.0.2".parse().unwrap();
    let c: IpAddr = "10.0.0.3".parse().unwrap();
    let a1 = now(slots.take(a, true));
    let mut wa = queued(slots.take(a, true));
    let b1 = now(slots.take(b, true));
    // At the total cap, c evicts the oldest (a1): one over the cap
    // until a1's connection ends.
    {
        let mut st = slots.state.lock();
        st.by_age.get_mut(&a1.id).unwrap().0 -= EVICT_AFTER;
    }
    let c1 = now(slots.take(c, true));
    assert!(a1.evicted.is_cancelled());
    // a1 ends: a has room again but the total is full, so wa waits...
    drop(a1);
    assert!(wa.slot.try_recv().is_err());
    assert_eq!(slots.state.lock().starved.len(), 1);
    // ...and takes the next slot freed by anyone.
    drop(b1);
    let got = wa.slot.try_recv().expect("served when b's slot freed");
    drop((wa, got, c1));
    assert_idle(&slots);
}

#[test]
fn canned_answers_are_whole_http_responses_with_retry_after() {
    for (canned, status) in [(Canned::TooMany, "429"), (Canned::Busy, "503")] {
        let text = String::from_utf8(canned.response()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
        assert!(head.contains("\r\nRetry-After: 1\r\n"), "{head}");
        assert!(head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())));
    }
}
