//! Room given back: a table or queue that a crowd grew keeps its room
//! after the crowd has left, and its blocks, long-lived, pin the pages of
//! the heap they sit among (the OS cannot take back a page with one live
//! block). Shrunk once three quarters empty, it gives most of it back.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Room below this is kept whatever the use.
pub const KEEP: usize = 64;

/// Gives back most of `t`'s room once three quarters of it are empty
/// (room over [`KEEP`]): it keeps twice what it holds.
pub fn give_back<T: Room>(t: &mut T) {
    let (len, cap) = (t.held(), t.room());
    if cap > KEEP && len < cap / 4 {
        t.shrink_to(len * 2);
    }
}

/// A collection with room of its own.
pub trait Room {
    /// What it holds.
    fn held(&self) -> usize;
    /// What it can hold without growing.
    fn room(&self) -> usize;
    fn shrink_to(&mut self, min: usize);
}

impl<K: Hash + Eq, V, S: BuildHasher> Room for HashMap<K, V, S> {
    fn held(&self) -> usize {
        HashMap::len(self)
    }
    fn room(&self) -> usize {
        self.capacity()
    }
    fn shrink_to(&mut self, min: usize) {
        HashMap::shrink_to(self, min);
    }
}

impl<K: Hash + Eq, S: BuildHasher> Room for HashSet<K, S> {
    fn held(&self) -> usize {
        HashSet::len(self)
    }
    fn room(&self) -> usize {
        self.capacity()
    }
    fn shrink_to(&mut self, min: usize) {
        HashSet::shrink_to(self, min);
    }
}

impl<T> Room for VecDeque<T> {
    fn held(&self) -> usize {
        VecDeque::len(self)
    }
    fn room(&self) -> usize {
        self.capacity()
    }
    fn shrink_to(&mut self, min: usize) {
        VecDeque::shrink_to(self, min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deque(room: usize, len: usize) -> VecDeque<u64> {
        let mut q = VecDeque::with_capacity(room);
        q.extend(0..len as u64);
        assert_eq!(q.capacity(), room);
        q
    }

    #[test]
    fn a_queue_three_quarters_empty_keeps_twice_what_it_holds() {
        let mut q = deque(1000, 100);
        give_back(&mut q);
        assert_eq!(q.capacity(), 200);
        let mut q = deque(1000, 0);
        give_back(&mut q);
        assert_eq!(q.capacity(), 0);
    }

    #[test]
    fn a_queue_a_quarter_full_or_small_keeps_its_room() {
        let mut q = deque(1000, 250);
        give_back(&mut q);
        assert_eq!(q.capacity(), 1000, "a quarter full");
        let mut q = deque(KEEP, 1);
        give_back(&mut q);
        assert_eq!(q.capacity(), KEEP, "not over KEEP");
        let mut q = deque(KEEP + 1, 1);
        give_back(&mut q);
        assert_eq!(q.capacity(), 2);
    }

    #[test]
    fn maps_and_sets_give_back_too() {
        let mut m: HashMap<u64, u64> = (0..10_000).map(|i| (i, i)).collect();
        m.retain(|k, _| *k < 10);
        let before = m.capacity();
        give_back(&mut m);
        assert!(
            m.capacity() < before / 100 && m.capacity() >= 20,
            "{}",
            m.capacity()
        );
        assert_eq!(Room::held(&m), 10);
        let mut s: HashSet<u64> = (0..10_000).collect();
        s.retain(|k| *k < 10);
        give_back(&mut s);
        assert!(s.capacity() < 100 && s.capacity() >= 20, "{}", s.capacity());
        assert_eq!(Room::held(&s), 10);
    }
}
