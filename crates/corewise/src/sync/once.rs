//! One-time initialisation: [`OnceLock`] (a value set once) and [`Once`]
//! (a function run once), whose waiters block their user thread.
//!
//! A state word goes from empty to running (one thread won the right to
//! initialise) to complete. Threads that find it running wait on a
//! [`WaitQueue`] for it to leave that state; the initialiser publishes the
//! value, marks it complete and wakes them all. If the initialiser panics,
//! the state goes back to empty and the waiters are woken: one of them
//! becomes the initialiser (std's `OnceLock` does the same; std's `Once`
//! is poisoned instead, see [`Once`]).

use super::wait_queue::WaitQueue;
use crate::shim::{AtomicU32, Ordering, UnsafeCell};
use std::mem::MaybeUninit;

const EMPTY: u32 = 0;
const RUNNING: u32 = 1;
const COMPLETE: u32 = 2;

/// A cell written once, as `std::sync::OnceLock`; threads that ask for
/// the value while another initialises it block (user threads: only the
/// thread).
///
/// ```
/// use corewise::sync::OnceLock;
/// static CONFIG: OnceLock<String> = OnceLock::new();
/// let rt = corewise::Runtime::new().unwrap();
/// let hs: Vec<_> = (0..4).map(|_| rt.spawn(|| CONFIG.get_or_init(|| "loaded".into()).len()).unwrap()).collect();
/// for h in hs { assert_eq!(h.join().unwrap(), 6); }
/// assert_eq!(CONFIG.get().map(String::as_str), Some("loaded"));
/// ```
pub struct OnceLock<T> {
    state: AtomicU32,
    waiters: WaitQueue,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: as std's: the value is shared between threads once set (`Sync`)
// and may be set by one thread and dropped by another (`Send`).
unsafe impl<T: Send + Sync> Sync for OnceLock<T> {}
// SAFETY: owning the lock is owning the value.
unsafe impl<T: Send> Send for OnceLock<T> {}

/// Puts the state back to empty and wakes the waiters when the
/// initialiser fails or unwinds.
struct ResetOnUnwind<'a> {
    state: &'a AtomicU32,
    waiters: &'a WaitQueue,
}

impl Drop for ResetOnUnwind<'_> {
    fn drop(&mut self) {
        self.state.store(EMPTY, Ordering::SeqCst);
        self.waiters.notify_all();
    }
}

impl<T> OnceLock<T> {
    /// An empty cell (usable in a `static`).
    ///
    /// ```
    /// let c: corewise::sync::OnceLock<u8> = corewise::sync::OnceLock::new();
    /// assert!(c.get().is_none());
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            waiters: WaitQueue::new(),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// An empty cell.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            waiters: WaitQueue::new(),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The value, if it is set (never blocks).
    ///
    /// ```
    /// let c = corewise::sync::OnceLock::new();
    /// assert_eq!(c.get(), None);
    /// c.set(7).unwrap();
    /// assert_eq!(c.get(), Some(&7));
    /// ```
    pub fn get(&self) -> Option<&T> {
        if self.state.load(Ordering::Acquire) == COMPLETE {
            // SAFETY: complete: the value was written before the Release
            // store we synchronised with, and is never written again.
            Some(unsafe { self.value_ref() })
        } else {
            None
        }
    }

    /// # Safety
    /// The state is `COMPLETE` (seen with Acquire ordering).
    unsafe fn value_ref(&self) -> &T {
        // SAFETY: per our contract the value is initialised and no longer
        // written; the pointer outlives `&self`.
        self.value.with(|p| unsafe { (*p).assume_init_ref() })
    }

    /// The value, initialising it with `f` if it is empty. If another
    /// thread is initialising it, waits for that. If `f` panics, the panic
    /// reaches the caller and the cell stays empty (a waiting thread then
    /// initialises it).
    ///
    /// ```
    /// let c = corewise::sync::OnceLock::new();
    /// assert_eq!(*c.get_or_init(|| 1), 1);
    /// assert_eq!(*c.get_or_init(|| 2), 1);
    /// ```
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        match self.initialize(|| Ok::<T, std::convert::Infallible>(f())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// Sets the value if the cell is empty; otherwise gives `value` back.
    /// Waits if another thread is initialising it.
    ///
    /// ```
    /// let c = corewise::sync::OnceLock::new();
    /// assert_eq!(c.set(1), Ok(()));
    /// assert_eq!(c.set(2), Err(2));
    /// ```
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        // The closure runs only if the cell was empty, and then `value` is
        // still there; `Err` is for the impossible other case.
        let _ = self.initialize(|| value.take().ok_or(()));
        match value {
            None => Ok(()),
            Some(v) => Err(v),
        }
    }

    /// The value, through exclusive access (never blocks).
    ///
    /// ```
    /// let mut c = corewise::sync::OnceLock::new();
    /// c.set(1).unwrap();
    /// *c.get_mut().unwrap() += 1;
    /// assert_eq!(c.get(), Some(&2));
    /// ```
    pub fn get_mut(&mut self) -> Option<&mut T> {
        if self.state.load(Ordering::Acquire) == COMPLETE {
            // SAFETY: complete, so initialised; `&mut self` is exclusive.
            Some(self.value.with_mut(|p| unsafe { (*p).assume_init_mut() }))
        } else {
            None
        }
    }

    /// Takes the value out, leaving the cell empty.
    ///
    /// ```
    /// let mut c = corewise::sync::OnceLock::new();
    /// c.set(String::from("v")).unwrap();
    /// assert_eq!(c.take().as_deref(), Some("v"));
    /// assert!(c.get().is_none());
    /// ```
    pub fn take(&mut self) -> Option<T> {
        if self.state.load(Ordering::Acquire) != COMPLETE {
            return None;
        }
        self.state.store(EMPTY, Ordering::Relaxed);
        // SAFETY: it was complete, so initialised; marked empty first, so
        // it is neither read again nor dropped twice.
        Some(self.value.with_mut(|p| unsafe { (*p).assume_init_read() }))
    }

    /// The value, if it was set, taking the cell apart.
    ///
    /// ```
    /// let c = corewise::sync::OnceLock::new();
    /// c.set(3).unwrap();
    /// assert_eq!(c.into_inner(), Some(3));
    /// ```
    pub fn into_inner(mut self) -> Option<T> {
        self.take()
    }

    /// Runs `f` if the cell is empty and nobody runs an initialiser, waits
    /// if somebody does; the value, or `f`'s error (the cell stays empty).
    fn initialize<E>(&self, f: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        loop {
            if let Some(v) = self.get() {
                return Ok(v);
            }
            if self
                .state
                .compare_exchange(EMPTY, RUNNING, Ordering::Acquire, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
            // Running elsewhere (or complete since: the check says so).
            self.waiters
                .wait(None, || self.state.load(Ordering::SeqCst) == RUNNING, || {});
        }
        let reset = ResetOnUnwind {
            state: &self.state,
            waiters: &self.waiters,
        };
        match f() {
            Ok(v) => {
                std::mem::forget(reset);
                // SAFETY: RUNNING is ours alone: nobody else reads or
                // writes the value until COMPLETE.
                self.value.with_mut(|p| unsafe { (*p).write(v) });
                self.state.store(COMPLETE, Ordering::SeqCst);
                self.waiters.notify_all();
                // SAFETY: we just completed it.
                Ok(unsafe { self.value_ref() })
            }
            Err(e) => {
                // Empty again, the waiters woken: one of them initialises.
                drop(reset);
                Err(e)
            }
        }
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for OnceLock<T> {
    fn drop(&mut self) {
        if self.state.load(Ordering::Acquire) == COMPLETE {
            // SAFETY: complete, so initialised; dropped once, here.
            self.value.with_mut(|p| unsafe { (*p).assume_init_drop() });
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_tuple("OnceLock");
        match self.get() {
            Some(v) => d.field(v),
            None => d.field(&format_args!("<uninit>")),
        };
        d.finish()
    }
}

/// Runs a function once, as `std::sync::Once`; callers that arrive while
/// it runs block (user threads: only the thread).
///
/// Unlike std's, a `Once` whose function panicked is not poisoned: the
/// next `call_once` runs its own function (as [`OnceLock`] does).
///
/// ```
/// use corewise::sync::Once;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// static INIT: Once = Once::new();
/// static RUNS: AtomicUsize = AtomicUsize::new(0);
/// let rt = corewise::Runtime::new().unwrap();
/// let hs: Vec<_> = (0..4).map(|_| rt.spawn(|| INIT.call_once(|| { RUNS.fetch_add(1, Ordering::Relaxed); })).unwrap()).collect();
/// for h in hs { h.join().unwrap(); }
/// assert_eq!(RUNS.load(Ordering::Relaxed), 1);
/// assert!(INIT.is_completed());
/// ```
#[derive(Debug, Default)]
pub struct Once(OnceLock<()>);

impl Once {
    /// A `Once` that has not run (usable in a `static`).
    ///
    /// ```
    /// assert!(!corewise::sync::Once::new().is_completed());
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// A `Once` that has not run.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self(OnceLock::new())
    }

    /// Runs `f` if no call has completed yet; returns once one has.
    ///
    /// ```
    /// let once = corewise::sync::Once::new();
    /// let mut n = 0;
    /// once.call_once(|| n += 1);
    /// once.call_once(|| n += 1);
    /// assert_eq!(n, 1);
    /// ```
    pub fn call_once(&self, f: impl FnOnce()) {
        self.0.get_or_init(f);
    }

    /// Whether a call has completed.
    ///
    /// ```
    /// let once = corewise::sync::Once::new();
    /// once.call_once(|| {});
    /// assert!(once.is_completed());
    /// ```
    pub fn is_completed(&self) -> bool {
        self.0.get().is_some()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    /// Two racing initialisers: one runs, both see its value.
    #[test]
    fn once_lock_initialises_once() {
        loom::model(|| {
            let c = Arc::new(OnceLock::new());
            let runs = Arc::new(AtomicUsize::new(0));
            let t = {
                let (c, runs) = (c.clone(), runs.clone());
                loom::thread::spawn(move || {
                    *c.get_or_init(|| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        1
                    })
                })
            };
            let mine = *c.get_or_init(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                2
            });
            let theirs = t.join().unwrap();
            assert_eq!(mine, theirs);
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        });
    }

    /// `set` racing `get_or_init`: exactly one value wins and `set` says
    /// which.
    #[test]
    fn once_lock_set_races_init() {
        loom::model(|| {
            let c = Arc::new(OnceLock::new());
            let t = {
                let c = c.clone();
                loom::thread::spawn(move || c.set(1).is_ok())
            };
            let got = *c.get_or_init(|| 2);
            let set_won = t.join().unwrap();
            assert_eq!(got, if set_won { 1 } else { 2 });
        });
    }
}
