//! A bounded queue with one receiving task, that holds no memory while it
//! is empty: each connection has two (its live events, its query answers)
//! and most connections are idle most of the time. A tokio channel
//! allocates its first block of 32 slots and some 500 bytes of state when
//! it is made.
//!
//! - [`Mailbox::try_send`] never waits: past `cap` items it gives the item
//!   back (the sender decides what a full queue means).
//! - [`Mailbox::recv`] is cancel-safe: an item is taken only by the poll
//!   that returns it.
//! - The receiver's side calls [`Mailbox::close`] when it goes: what is
//!   queued is dropped at once, and later sends give their item back.
//! - Emptied, the queue frees its storage unless it is small (at most
//!   `KEEP` items, a parameter: a connection's query answers keep none).
//! - Its state is 40 bytes: an empty queue keeps no `VecDeque` of its own.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

/// Storage kept by an emptied queue, in items, unless the queue says
/// otherwise (a connection that gets a message now and then does not
/// allocate each time).
pub const KEEP_WHEN_EMPTY: usize = 4;

/// A queue of `T` that keeps storage for up to `KEEP` items once emptied.
pub struct Mailbox<T, const KEEP: usize = KEEP_WHEN_EMPTY> {
    state: Mutex<State<T>>,
}

struct State<T> {
    /// `None` while the queue is empty and keeps no storage (boxed: 8
    /// bytes in every queue, not a `VecDeque`'s 32).
    #[allow(clippy::box_collection)]
    items: Option<Box<VecDeque<T>>>,
    /// At least 1 (4 bytes: with `closed`, the state packs into 32).
    cap: u32,
    waker: Option<Waker>,
    closed: bool,
}

/// Why an item was not queued; it is given back.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError<T> {
    Full(T),
    Closed(T),
}

impl<T> Mailbox<T> {
    /// A queue of at most `cap` items (at least 1).
    pub fn new(cap: usize) -> Mailbox<T> {
        Mailbox::with_cap(cap)
    }
}

impl<T> Mailbox<T, 0> {
    /// A queue of at most `cap` items (at least 1) that keeps no storage
    /// once emptied.
    pub fn keeping_nothing(cap: usize) -> Mailbox<T, 0> {
        Mailbox::with_cap(cap)
    }
}

impl<T, const KEEP: usize> Mailbox<T, KEEP> {
    fn with_cap(cap: usize) -> Mailbox<T, KEEP> {
        Mailbox {
            state: Mutex::new(State {
                items: None,
                cap: u32::try_from(cap.max(1)).unwrap_or(u32::MAX),
                waker: None,
                closed: false,
            }),
        }
    }

    /// Bounds the queue at `cap` items (at least 1) from now on.
    pub fn set_cap(&self, cap: usize) {
        self.state.lock().cap = u32::try_from(cap.max(1)).unwrap_or(u32::MAX);
    }

    /// Queues `item` unless the queue is full or closed.
    pub fn try_send(&self, item: T) -> Result<(), SendError<T>> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(SendError::Closed(item));
        }
        if st.len() >= st.cap as usize {
            return Err(SendError::Full(item));
        }
        st.items.get_or_insert_default().push_back(item);
        let waker = st.waker.take();
        drop(st);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// The next item, waiting for one. Cancel-safe. The future is one
    /// pointer: a connection's task holds it in every wait.
    pub fn recv(&self) -> impl std::future::Future<Output = T> + '_ {
        poll_fn(|cx| self.poll_recv(cx))
    }

    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut st = self.state.lock();
        match st.pop::<KEEP>() {
            Some(item) => Poll::Ready(item),
            None => {
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// Wakes the receiver without an item (it looks at its other state:
    /// a connection's live queue is woken so when the relay stops).
    pub fn wake(&self) {
        let waker = self.state.lock().waker.take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// An item already queued, if any.
    pub fn try_recv(&self) -> Option<T> {
        self.state.lock().pop::<KEEP>()
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.state.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The receiver is gone: drops what is queued (outside the lock) and
    /// refuses what comes.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        st.waker = None;
        let items = std::mem::take(&mut st.items);
        drop(st);
        drop(items);
    }
}

impl<T> State<T> {
    fn len(&self) -> usize {
        self.items.as_ref().map_or(0, |q| q.len())
    }

    /// The next item; emptied, the queue frees its storage if it holds
    /// room for more than `KEEP` items.
    fn pop<const KEEP: usize>(&mut self) -> Option<T> {
        let items = self.items.as_mut()?;
        let item = items.pop_front()?;
        if items.is_empty() && items.capacity() > KEEP {
            self.items = None;
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn items_come_out_in_order_and_past_the_cap_are_given_back() {
        let m = Mailbox::new(3);
        for i in 0..3 {
            m.try_send(i).unwrap();
        }
        assert_eq!(m.try_send(9), Err(SendError::Full(9)));
        assert_eq!(m.len(), 3);
        assert_eq!(m.recv().await, 0);
        m.try_send(3).unwrap();
        assert_eq!((m.recv().await, m.recv().await, m.recv().await), (1, 2, 3));
        assert_eq!(m.try_recv(), None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send_from_another_thread() {
        let m = Arc::new(Mailbox::new(8));
        let m2 = m.clone();
        let waiter = tokio::spawn(async move { m2.recv().await });
        tokio::task::yield_now().await;
        std::thread::spawn(move || m.try_send(7u32).unwrap())
            .join()
            .unwrap();
        assert_eq!(waiter.await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_dropped_recv_takes_nothing() {
        let m = Mailbox::new(2);
        {
            let fut = std::pin::pin!(m.recv());
            // Polled once (pending), then dropped.
            let mut cx = Context::from_waker(Waker::noop());
            assert!(std::future::Future::poll(fut, &mut cx).is_pending());
        }
        m.try_send(1).unwrap();
        assert_eq!(m.recv().await, 1);
    }

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn closing_drops_what_is_queued_and_refuses_more() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let m = Mailbox::new(4);
        m.try_send(Counted(dropped.clone())).ok().unwrap();
        m.try_send(Counted(dropped.clone())).ok().unwrap();
        m.close();
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
        assert!(matches!(
            m.try_send(Counted(dropped.clone())),
            Err(SendError::Closed(_))
        ));
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            3,
            "the refused item dropped by the caller"
        );
    }

    #[test]
    fn an_emptied_queue_frees_its_storage_unless_small() {
        let m = Mailbox::new(1000);
        for i in 0..100 {
            m.try_send(i).unwrap();
        }
        while m.try_recv().is_some() {}
        let capacity = |m: &Mailbox<_, KEEP_WHEN_EMPTY>| {
            m.state.lock().items.as_ref().map_or(0, |q| q.capacity())
        };
        assert_eq!(capacity(&m), 0);
        m.try_send(1).unwrap();
        m.try_recv();
        assert!(capacity(&m) <= KEEP_WHEN_EMPTY);
    }

    #[test]
    fn a_queue_that_keeps_nothing_frees_its_storage_when_emptied() {
        let m = Mailbox::keeping_nothing(8);
        m.try_send(1u32).unwrap();
        m.try_recv();
        assert!(m.state.lock().items.is_none());
        assert_eq!(std::mem::size_of::<Mutex<State<u32>>>(), 40);
    }
}
