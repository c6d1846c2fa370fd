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
//! - Emptied, the queue frees its storage unless it is small.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

/// Storage kept by an emptied queue, in items (a connection that gets a
/// message now and then does not allocate each time).
const KEEP_WHEN_EMPTY: usize = 4;

pub struct Mailbox<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    items: VecDeque<T>,
    /// At least 1 (4 bytes: with `closed`, the state packs into 56).
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
        Mailbox {
            state: Mutex::new(State {
                items: VecDeque::new(),
                cap: u32::try_from(cap.max(1)).unwrap_or(u32::MAX),
                waker: None,
                closed: false,
            }),
        }
    }

    /// Queues `item` unless the queue is full or closed.
    pub fn try_send(&self, item: T) -> Result<(), SendError<T>> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(SendError::Closed(item));
        }
        if st.items.len() >= st.cap as usize {
            return Err(SendError::Full(item));
        }
        st.items.push_back(item);
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
        match st.pop() {
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
        self.state.lock().pop()
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.state.lock().items.len()
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
    fn pop(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        if self.items.is_empty() && self.items.capacity() > KEEP_WHEN_EMPTY {
            self.items = VecDeque::new();
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
        assert_eq!(m.state.lock().items.capacity(), 0);
        m.try_send(1).unwrap();
        m.try_recv();
        assert!(m.state.lock().items.capacity() <= KEEP_WHEN_EMPTY);
    }
}
