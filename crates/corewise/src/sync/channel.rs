//! A bounded multi-producer, multi-consumer channel.
//!
//! A spin-locked ring buffer plus two wait queues (receivers waiting for an
//! item, senders waiting for room). A waiter checks the buffer under its
//! queue's lock before it blocks, and the other side notifies after
//! changing the buffer, so a wakeup cannot fall between check and block.

use super::spin::SpinLock;
use super::wait_queue::{WaitOutcome, WaitQueue};
use crate::shim::{AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

struct Chan<T> {
    buf: SpinLock<VecDeque<T>>,
    cap: usize,
    senders: AtomicUsize,
    receivers: AtomicUsize,
    not_empty: WaitQueue,
    not_full: WaitQueue,
}

/// The sending half; clone it for more producers.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let (tx, rx) = corewise::sync::channel(8);
/// let producers: Vec<_> = (0..3u32)
///     .map(|i| {
///         let tx = tx.clone();
///         rt.spawn(move || tx.send(i).unwrap()).unwrap()
///     })
///     .collect();
/// drop(tx);
/// for p in producers {
///     p.join().unwrap();
/// }
/// let mut got: Vec<u32> = std::iter::from_fn(|| rx.recv().ok()).collect();
/// got.sort();
/// assert_eq!(got, [0, 1, 2]);
/// ```
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// The receiving half; clone it for more consumers.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let (tx, rx) = corewise::sync::channel(4);
/// let rx2 = rx.clone();
/// let other = rt.spawn(move || rx2.recv().unwrap()).unwrap();
/// tx.send(1).unwrap();
/// tx.send(2).unwrap();
/// let mine = rx.recv().unwrap();
/// assert_eq!(mine + other.join().unwrap(), 3);
/// ```
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

/// Every receiver is gone; the value comes back.
///
/// ```
/// use corewise::sync::{channel, SendError};
/// let (tx, rx) = channel(1);
/// drop(rx);
/// assert_eq!(tx.send("lost"), Err(SendError("lost")));
/// ```
#[derive(Debug, Error, PartialEq, Eq)]
#[error("sending on a channel with no receiver")]
pub struct SendError<T>(pub T);

/// Why `try_send` did not send.
///
/// ```
/// use corewise::sync::{channel, TrySendError};
/// let (tx, rx) = channel(1);
/// tx.try_send(1).unwrap();
/// assert_eq!(tx.try_send(2), Err(TrySendError::Full(2)));
/// drop(rx);
/// assert_eq!(tx.try_send(3), Err(TrySendError::Disconnected(3)));
/// ```
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// The channel is full.
    #[error("channel full")]
    Full(T),
    /// Every receiver is gone.
    #[error("no receiver")]
    Disconnected(T),
}

/// Why `send_timeout` did not send.
///
/// ```
/// use corewise::sync::{channel, SendTimeoutError};
/// use std::time::Duration;
/// let (tx, rx) = channel(1);
/// tx.send(1).unwrap();
/// let full = tx.send_timeout(2, Duration::from_millis(1));
/// assert_eq!(full, Err(SendTimeoutError::Timeout(2)));
/// drop(rx);
/// let gone = tx.send_timeout(3, Duration::from_millis(1));
/// assert_eq!(gone, Err(SendTimeoutError::Disconnected(3)));
/// ```
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SendTimeoutError<T> {
    /// Still full at the deadline.
    #[error("timed out")]
    Timeout(T),
    /// Every receiver is gone.
    #[error("no receiver")]
    Disconnected(T),
}

/// Every sender is gone and the channel is empty.
///
/// ```
/// use corewise::sync::{channel, RecvError};
/// let (tx, rx) = channel(1);
/// tx.send(5).unwrap();
/// drop(tx);
/// assert_eq!(rx.recv(), Ok(5)); // what was sent is still delivered
/// assert_eq!(rx.recv(), Err(RecvError));
/// ```
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
#[error("receiving on an empty channel with no sender")]
pub struct RecvError;

/// Why `try_recv` got nothing.
///
/// ```
/// use corewise::sync::{channel, TryRecvError};
/// let (tx, rx) = channel::<u8>(1);
/// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
/// drop(tx);
/// assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
/// ```
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum TryRecvError {
    /// Nothing there now.
    #[error("channel empty")]
    Empty,
    /// Empty and every sender is gone.
    #[error("no sender")]
    Disconnected,
}

/// Why `recv_timeout` got nothing.
///
/// ```
/// use corewise::sync::{channel, RecvTimeoutError};
/// use std::time::Duration;
/// let (tx, rx) = channel::<u8>(1);
/// assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Err(RecvTimeoutError::Timeout));
/// drop(tx);
/// assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Err(RecvTimeoutError::Disconnected));
/// ```
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum RecvTimeoutError {
    /// Still empty at the deadline.
    #[error("timed out")]
    Timeout,
    /// Empty and every sender is gone.
    #[error("no sender")]
    Disconnected,
}

/// A channel holding at most `capacity` items (at least 1).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let (tx, rx) = corewise::sync::channel(4);
/// let producer = rt.spawn(move || for i in 0..100 { tx.send(i).unwrap() }).unwrap();
/// let consumer = rt.spawn(move || {
///     let mut sum = 0;
///     while let Ok(v) = rx.recv() { sum += v }
///     sum
/// }).unwrap();
/// producer.join().unwrap();
/// assert_eq!(consumer.join().unwrap(), 4950);
/// ```
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let cap = capacity.max(1);
    let chan = Arc::new(Chan {
        buf: SpinLock::new(VecDeque::with_capacity(cap)),
        cap,
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
        not_empty: WaitQueue::new(),
        not_full: WaitQueue::new(),
    });
    (Sender { chan: chan.clone() }, Receiver { chan })
}

impl<T> Sender<T> {
    /// Sends, blocking while the channel is full.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = corewise::sync::channel(1);
    /// // The second send blocks its user thread until the first item is taken.
    /// let h = rt.spawn(move || (0..2).map(|i| tx.send(i)).collect::<Vec<_>>()).unwrap();
    /// assert_eq!(rx.recv(), Ok(0));
    /// assert_eq!(rx.recv(), Ok(1));
    /// assert_eq!(h.join().unwrap(), [Ok(()), Ok(())]);
    /// ```
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.send_until(value, None).map_err(|e| match e {
            SendTimeoutError::Timeout(v) | SendTimeoutError::Disconnected(v) => SendError(v),
        })
    }

    /// Sends if there is room now.
    ///
    /// ```
    /// use corewise::sync::{channel, TrySendError};
    /// let (tx, rx) = channel(2);
    /// assert_eq!(tx.try_send('a'), Ok(()));
    /// assert_eq!(tx.try_send('b'), Ok(()));
    /// assert_eq!(tx.try_send('c'), Err(TrySendError::Full('c')));
    /// assert_eq!(rx.len(), 2);
    /// ```
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let c = &*self.chan;
        let mut buf = c.buf.lock();
        if c.receivers.load(Ordering::SeqCst) == 0 {
            return Err(TrySendError::Disconnected(value));
        }
        if buf.len() >= c.cap {
            return Err(TrySendError::Full(value));
        }
        buf.push_back(value);
        drop(buf);
        c.not_empty.notify_one();
        Ok(())
    }

    /// Sends, giving up after `timeout`.
    ///
    /// ```
    /// use corewise::sync::{channel, SendTimeoutError};
    /// use std::time::Duration;
    /// let (tx, rx) = channel(1);
    /// assert_eq!(tx.send_timeout(1, Duration::from_millis(1)), Ok(()));
    /// assert_eq!(tx.send_timeout(2, Duration::from_millis(1)), Err(SendTimeoutError::Timeout(2)));
    /// assert_eq!(rx.recv(), Ok(1));
    /// ```
    pub fn send_timeout(&self, value: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send_until(value, crate::deadline::after(timeout))
    }

    fn send_until(
        &self,
        mut value: T,
        deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        let c = &*self.chan;
        loop {
            match self.try_send(value) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(v)) => {
                    return Err(SendTimeoutError::Disconnected(v))
                }
                Err(TrySendError::Full(v)) => value = v,
            }
            let outcome = c.not_full.wait(
                deadline,
                || c.buf.lock().len() >= c.cap && c.receivers.load(Ordering::SeqCst) > 0,
                || {},
            );
            if outcome == WaitOutcome::TimedOut {
                return match self.try_send(value) {
                    Ok(()) => Ok(()),
                    Err(TrySendError::Full(v)) => Err(SendTimeoutError::Timeout(v)),
                    Err(TrySendError::Disconnected(v)) => Err(SendTimeoutError::Disconnected(v)),
                };
            }
        }
    }
}

impl<T> Receiver<T> {
    /// Receives, blocking while the channel is empty; fails once it is empty
    /// and every sender is gone.
    ///
    /// ```
    /// use corewise::sync::{channel, RecvError};
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = channel(1);
    /// let h = rt.spawn(move || (rx.recv(), rx.recv())).unwrap();
    /// tx.send("hi").unwrap();
    /// drop(tx);
    /// assert_eq!(h.join().unwrap(), (Ok("hi"), Err(RecvError)));
    /// ```
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_until(None).map_err(|_| RecvError)
    }

    /// Receives if an item is there now.
    ///
    /// ```
    /// use corewise::sync::{channel, TryRecvError};
    /// let (tx, rx) = channel(1);
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    /// tx.send(9).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(9));
    /// ```
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let c = &*self.chan;
        let mut buf = c.buf.lock();
        match buf.pop_front() {
            Some(v) => {
                drop(buf);
                c.not_full.notify_one();
                Ok(v)
            }
            None if c.senders.load(Ordering::SeqCst) == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives, giving up after `timeout`.
    ///
    /// ```
    /// use corewise::sync::{channel, RecvTimeoutError};
    /// use std::time::Duration;
    /// let (_tx, rx) = channel::<u8>(1);
    /// assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Err(RecvTimeoutError::Timeout));
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(crate::deadline::after(timeout))
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let c = &*self.chan;
        loop {
            match self.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let outcome = c.not_empty.wait(
                deadline,
                || c.buf.lock().is_empty() && c.senders.load(Ordering::SeqCst) > 0,
                || {},
            );
            if outcome == WaitOutcome::TimedOut {
                return match self.try_recv() {
                    Ok(v) => Ok(v),
                    Err(TryRecvError::Empty) => Err(RecvTimeoutError::Timeout),
                    Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                };
            }
        }
    }

    /// Items waiting now.
    ///
    /// ```
    /// let (tx, rx) = corewise::sync::channel(4);
    /// tx.send(1).unwrap();
    /// tx.send(2).unwrap();
    /// assert_eq!(rx.len(), 2);
    /// rx.recv().unwrap();
    /// assert_eq!(rx.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.chan.buf.lock().len()
    }

    /// Whether no item waits now.
    ///
    /// ```
    /// let (tx, rx) = corewise::sync::channel(4);
    /// assert!(rx.is_empty());
    /// tx.send(()).unwrap();
    /// assert!(!rx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An iterator that blocks for each item, as [`recv`](Self::recv), and
    /// ends once every sender is gone and the buffer is empty (std's
    /// `Receiver::iter`).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = corewise::sync::channel(2);
    /// let producer = rt.spawn(move || (1..=5).for_each(|i| tx.send(i).unwrap())).unwrap();
    /// let sum: i32 = rt.block_on(move || rx.iter().sum()).unwrap();
    /// producer.join().unwrap();
    /// assert_eq!(sum, 15);
    /// ```
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// An iterator over the items waiting now; it never blocks (std's
    /// `Receiver::try_iter`).
    ///
    /// ```
    /// let (tx, rx) = corewise::sync::channel(4);
    /// tx.send('a').unwrap();
    /// tx.send('b').unwrap();
    /// assert_eq!(rx.try_iter().collect::<String>(), "ab");
    /// assert_eq!(rx.try_iter().next(), None); // empty, senders still alive
    /// ```
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }
}

/// The blocking iterator of [`Receiver::iter`].
///
/// ```
/// let (tx, rx) = corewise::sync::channel(1);
/// tx.send(3).unwrap();
/// drop(tx);
/// let mut it: corewise::sync::Iter<'_, i32> = rx.iter();
/// assert_eq!((it.next(), it.next()), (Some(3), None));
/// ```
#[derive(Debug)]
pub struct Iter<'a, T> {
    rx: &'a Receiver<T>,
}

impl<T> Iterator for Iter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.rx.recv().ok()
    }
}

/// The non-blocking iterator of [`Receiver::try_iter`].
///
/// ```
/// let (tx, rx) = corewise::sync::channel(2);
/// tx.send(1).unwrap();
/// let it: corewise::sync::TryIter<'_, i32> = rx.try_iter();
/// assert_eq!(it.collect::<Vec<_>>(), [1]);
/// ```
#[derive(Debug)]
pub struct TryIter<'a, T> {
    rx: &'a Receiver<T>,
}

impl<T> Iterator for TryIter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.rx.try_recv().ok()
    }
}

/// The owning blocking iterator of a [`Receiver`] (`for x in rx`).
///
/// ```
/// let (tx, rx) = corewise::sync::channel(4);
/// tx.send("x").unwrap();
/// tx.send("y").unwrap();
/// drop(tx);
/// let it: corewise::sync::IntoIter<&str> = rx.into_iter();
/// assert_eq!(it.collect::<Vec<_>>(), ["x", "y"]);
/// ```
#[derive(Debug)]
pub struct IntoIter<T> {
    rx: Receiver<T>,
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.rx.recv().ok()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter { rx: self }
    }
}

impl<'a, T> IntoIterator for &'a Receiver<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.senders.fetch_add(1, Ordering::SeqCst);
        Self {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.chan.receivers.fetch_add(1, Ordering::SeqCst);
        Self {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.chan.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Take the buffer lock so no receiver is between its check and
            // its enqueue, then wake them all to see the disconnect.
            drop(self.chan.buf.lock());
            self.chan.not_empty.notify_all();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        if self.chan.receivers.fetch_sub(1, Ordering::SeqCst) == 1 {
            drop(self.chan.buf.lock());
            self.chan.not_full.notify_all();
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    #[test]
    fn channel_delivers_in_order_with_blocking_both_ways() {
        loom::model(|| {
            let (tx, rx) = channel(1);
            let t = loom::thread::spawn(move || {
                tx.send(1).unwrap();
                tx.send(2).unwrap();
            });
            assert_eq!(rx.recv(), Ok(1));
            assert_eq!(rx.recv(), Ok(2));
            assert_eq!(rx.recv(), Err(RecvError));
            t.join().unwrap();
        });
    }

    #[test]
    fn channel_two_producers() {
        loom::model(|| {
            let (tx, rx) = channel(1);
            let tx2 = tx.clone();
            let a = loom::thread::spawn(move || tx.send(1).unwrap());
            let b = loom::thread::spawn(move || tx2.send(2).unwrap());
            let x = rx.recv().unwrap();
            let y = rx.recv().unwrap();
            assert_eq!(x + y, 3);
            a.join().unwrap();
            b.join().unwrap();
        });
    }

    /// A receive whose deadline races a send: it either gets the item or
    /// times out and leaves no waiter behind (the item is then still there).
    #[test]
    fn channel_recv_timeout_races_send() {
        loom::model(|| {
            let (tx, rx) = channel(1);
            let t = loom::thread::spawn(move || tx.send(1).unwrap());
            let r = rx.recv_until(Some(Instant::now()));
            t.join().unwrap();
            match r {
                Ok(v) => assert_eq!(v, 1),
                Err(e) => {
                    assert_eq!(e, RecvTimeoutError::Timeout);
                    assert_eq!(rx.try_recv(), Ok(1));
                }
            }
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
            assert_eq!(rx.chan.not_empty.len.load(Ordering::SeqCst), 0);
        });
    }

    /// A send into a full channel whose deadline races a receive.
    #[test]
    fn channel_send_timeout_races_recv() {
        loom::model(|| {
            let (tx, rx) = channel(1);
            tx.send(1).unwrap();
            let t = loom::thread::spawn(move || {
                let r = tx.send_until(2, Some(Instant::now()));
                assert_eq!(tx.chan.not_full.len.load(Ordering::SeqCst), 0);
                r
            });
            assert_eq!(rx.recv(), Ok(1));
            match t.join().unwrap() {
                Ok(()) => assert_eq!(rx.recv(), Ok(2)),
                Err(e) => assert_eq!(e, SendTimeoutError::Timeout(2)),
            }
            assert_eq!(rx.recv(), Err(RecvError));
        });
    }

    /// Dropping the last receiver wakes a sender blocked on a full channel.
    #[test]
    fn channel_receiver_drop_wakes_blocked_sender() {
        loom::model(|| {
            let (tx, rx) = channel(1);
            tx.send(1).unwrap();
            let t = loom::thread::spawn(move || tx.send(2));
            drop(rx);
            assert_eq!(t.join().unwrap(), Err(SendError(2)));
        });
    }
}
