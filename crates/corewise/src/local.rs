//! Per-user-thread storage: the [`thread_local!`](crate::thread_local)
//! macro and its [`LocalKey`].
//!
//! Why it exists: `std::thread_local!` is per *kernel* thread, and a
//! kernel thread runs every user thread of its core in turn, so all of
//! them share one value, and a user thread that migrates (its core is
//! released, or it is woken on a less loaded core) sees another core's
//! value afterwards, even within one function. This module gives each user
//! thread its own values.
//!
//! How: every thread context carries one pointer, null until the thread
//! first touches a key, to a table of boxed values indexed by key. A key
//! gets its index from a global counter the first time it is used in the
//! process. An access reads the running context (the same thread-local the
//! scheduler keeps), loads that one pointer, indexes the table and follows
//! the value's box: no lock, no atomic read-modify-write. The table moves
//! with the context when the thread migrates, so a reference stays valid
//! across a switch to another core. When the thread's function returns or
//! panics, its values are dropped (before `join` returns, as with std) and
//! the pointer is reset, so the next thread to use the context starts with
//! none. Outside a user thread the table hangs off a `std` thread-local of
//! the calling OS thread instead and is dropped when that thread exits.
//!
//! Values need not be `Send` (an `Rc` is fine): only their own user thread
//! reaches them, and it may resume on another kernel thread, exactly as the
//! values on its stack do. A type tied to the *kernel* thread (one that
//! caches the OS thread id, say) is as unsuited here as on a user thread's
//! stack.

use crate::sched::current::current_slot;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A thread's values, by key index (boxed, so a reference survives the
/// table growing while it is held).
#[derive(Default)]
pub(crate) struct Table {
    values: Vec<Option<Box<dyn Any>>>,
}

/// The next key index plus one (0 marks a key without an index yet).
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(1);

/// Destructors that keep creating values are run this many rounds; what is
/// left after that is leaked (std may leak such values too).
const DESTRUCTOR_ROUNDS: usize = 8;

/// The table of the calling OS thread, for code outside user threads.
struct OsLocals(Cell<*mut Table>);

impl Drop for OsLocals {
    fn drop(&mut self) {
        // A destructor's panic has been reported by the panic hook; an OS
        // thread's exit has nobody to hand it to.
        let _ = run_destructors(&self.0);
    }
}

std::thread_local! {
    static OS_LOCALS: OsLocals = const { OsLocals(Cell::new(std::ptr::null_mut())) };
}

/// Calls `f` with the calling thread's table pointer: the running user
/// thread's, else the OS thread's.
#[inline]
fn with_table<R>(f: impl FnOnce(&Cell<*mut Table>) -> R) -> Result<R, AccessError> {
    match current_slot() {
        Some(ctx) => Ok(f(ctx.locals())),
        None => OS_LOCALS.try_with(|l| f(&l.0)).map_err(|_| AccessError),
    }
}

/// Drops every value in the table `cell` points to and resets it to null,
/// returning the first destructor panic. Destructors may use keys again
/// (the values they create are dropped in the next round).
///
/// Every thread's exit calls it, and most threads never used a key: the
/// check for an empty table is inlined, the work (with its unwinding
/// frame) is not.
#[inline]
pub(crate) fn run_destructors(cell: &Cell<*mut Table>) -> Option<Box<dyn Any + Send>> {
    if cell.get().is_null() {
        return None;
    }
    run_destructors_slow(cell)
}

#[inline(never)]
fn run_destructors_slow(cell: &Cell<*mut Table>) -> Option<Box<dyn Any + Send>> {
    let mut first_panic = None;
    for _ in 0..DESTRUCTOR_ROUNDS {
        // Read before writing: a thread that never used a key leaves its
        // context's line as it was.
        let t = cell.get();
        if t.is_null() {
            return first_panic;
        }
        cell.set(std::ptr::null_mut());
        // SAFETY: a non-null pointer in the cell came from `Box::into_raw`
        // in `LocalKey::initialize`, and it was just taken out of the cell,
        // so nothing else reaches the table now.
        let table = unsafe { Box::from_raw(t) };
        for value in table.values.into_iter().flatten() {
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                drop(value);
            }));
            if let Err(p) = dropped {
                first_panic.get_or_insert(p);
            }
        }
    }
    // Leaked on purpose (see `DESTRUCTOR_ROUNDS`); the cell is reset.
    cell.set(std::ptr::null_mut());
    first_panic
}

/// Drops the running user thread's values (at its exit); returns the first
/// destructor panic. Nothing to do on an OS thread.
#[inline]
pub(crate) fn exit_current() -> Option<Box<dyn Any + Send>> {
    // No key was ever used in the process (index 1 is the next one to
    // give): no thread can hold a value, and the exit of every thread
    // skips the lookup of the running thread. A key gets its index on its
    // first access, in program order before any value of it exists.
    if NEXT_INDEX.load(Ordering::Relaxed) == 1 {
        return None;
    }
    current_slot().and_then(|ctx| run_destructors(ctx.locals()))
}

/// The key of a per-user-thread value, made by
/// [`corewise::thread_local!`](crate::thread_local).
///
/// Like [`std::thread::LocalKey`], but each *user* thread has its own
/// value: created by the initializer on the thread's first access, dropped
/// when the thread's function returns or panics (before
/// [`JoinHandle::join`](crate::JoinHandle::join) returns). Outside a user
/// thread (on an OS thread, `main` included) the value belongs to the OS
/// thread and is dropped when it exits.
///
/// ```
/// use std::cell::Cell;
/// corewise::thread_local! {
///     static COUNTER: Cell<u32> = Cell::new(0);
/// }
/// let rt = corewise::Runtime::builder().cpus([0]).build().unwrap();
/// let counts = rt.block_on(|| {
///     // Two user threads on one core: each sees its own counter.
///     let a = corewise::spawn(|| { COUNTER.set(COUNTER.get() + 1); COUNTER.get() }).unwrap();
///     let b = corewise::spawn(|| { COUNTER.set(COUNTER.get() + 5); COUNTER.get() }).unwrap();
///     (a.join().unwrap(), b.join().unwrap())
/// }).unwrap();
/// assert_eq!(counts, (1, 5));
/// ```
pub struct LocalKey<T: 'static> {
    /// The key's table index plus one; 0 until first used.
    index: AtomicUsize,
    init: fn() -> T,
}

impl<T: 'static> std::fmt::Debug for LocalKey<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKey").finish_non_exhaustive()
    }
}

/// The calling OS thread's storage is being destroyed (a value's
/// destructor running at the OS thread's exit used a key).
///
/// ```
/// use corewise::local::AccessError;
/// corewise::thread_local!(static KEY: u32 = 1);
/// /// Uses `KEY` from its destructor, which runs as the OS thread exits.
/// struct UsesKeyOnDrop(std::sync::mpsc::Sender<Result<u32, AccessError>>);
/// impl Drop for UsesKeyOnDrop {
///     fn drop(&mut self) {
///         let _ = self.0.send(KEY.try_with(|v| *v));
///     }
/// }
/// std::thread_local!(static LAST: std::cell::RefCell<Option<UsesKeyOnDrop>> = const { std::cell::RefCell::new(None) });
/// let (tx, rx) = std::sync::mpsc::channel();
/// std::thread::spawn(move || {
///     LAST.with(|l| *l.borrow_mut() = Some(UsesKeyOnDrop(tx)));
///     assert_eq!(KEY.try_with(|v| *v), Ok(1)); // alive: fine
/// })
/// .join()
/// .unwrap();
/// // Thread-locals are destroyed in reverse order of first use: by the time
/// // `LAST` goes, the thread's corewise storage is gone.
/// assert_eq!(rx.recv().unwrap(), Err(AccessError));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot access a corewise thread-local value while the OS thread's storage is destroyed")]
pub struct AccessError;

impl<T: 'static> LocalKey<T> {
    /// Used by [`thread_local!`](crate::thread_local); not for direct use.
    #[doc(hidden)]
    pub const fn new(init: fn() -> T) -> Self {
        Self {
            index: AtomicUsize::new(0),
            init,
        }
    }

    #[inline]
    fn index(&self) -> usize {
        match self.index.load(Ordering::Relaxed) {
            0 => self.assign_index(),
            i => i - 1,
        }
    }

    #[cold]
    fn assign_index(&self) -> usize {
        let fresh = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
        // A loser leaves an unused index: a hole in the tables, harmless.
        match self
            .index
            .compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => fresh - 1,
            Err(won) => won - 1,
        }
    }

    /// Runs `f` on the calling thread's value, initialising it first if
    /// needed (with `init`, which may itself use thread-locals).
    #[inline]
    fn with_init<R>(
        &'static self,
        init: impl FnOnce() -> T,
        f: impl FnOnce(&T) -> R,
    ) -> Result<R, AccessError> {
        let index = self.index();
        let value = with_table(|cell| {
            let t = cell.get();
            if !t.is_null() {
                // SAFETY: the table belongs to the calling thread (only it
                // reaches its context's or OS thread's cell) and lives until
                // the thread exits; no `&mut` to it is live here.
                if let Some(Some(b)) = unsafe { &*t }.values.get(index) {
                    return (&**b as *const dyn Any).cast::<T>();
                }
            }
            Self::initialize(cell, index, init)
        })?;
        // SAFETY: the entry at `index` was made by this key, so it holds a
        // `T`; its box is dropped only at the thread's exit, after `f`.
        Ok(f(unsafe { &*value }))
    }

    #[cold]
    fn initialize(cell: &Cell<*mut Table>, index: usize, init: impl FnOnce() -> T) -> *const T {
        let fresh: Box<dyn Any> = Box::new(init());
        // `init` may have used thread-locals (this key too): look again.
        let mut t = cell.get();
        if t.is_null() {
            t = Box::into_raw(Box::<Table>::default());
            cell.set(t);
        }
        // SAFETY: as in `with_init`; this `&mut` ends before any user code
        // runs (the unused value is dropped after it).
        let table = unsafe { &mut *t };
        if table.values.len() <= index {
            table.values.resize_with(index + 1, || None);
        }
        let (value, unused) = match &mut table.values[index] {
            Some(existing) => (&**existing as *const dyn Any, Some(fresh)),
            empty => (&**empty.insert(fresh) as *const dyn Any, None),
        };
        drop(unused);
        value.cast::<T>()
    }

    /// Runs `f` with a reference to the calling thread's value,
    /// initialising it first on the thread's first access.
    ///
    /// # Panics
    /// If called by a destructor running at an OS thread's exit (see
    /// [`try_with`](Self::try_with)), or if the initializer panics.
    ///
    /// ```
    /// corewise::thread_local!(static NAME: String = String::from("unset"));
    /// assert_eq!(NAME.with(|n| n.len()), 5);
    /// ```
    pub fn with<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        match self.try_with(f) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`with`](Self::with), but fails instead of panicking when the
    /// calling OS thread's storage is being destroyed.
    ///
    /// ```
    /// corewise::thread_local!(static ID: u64 = 7);
    /// assert_eq!(ID.try_with(|v| *v), Ok(7));
    /// ```
    pub fn try_with<F, R>(&'static self, f: F) -> Result<R, AccessError>
    where
        F: FnOnce(&T) -> R,
    {
        self.with_init(self.init, f)
    }

    /// Stores `value` as the thread's value without running the
    /// initializer if there is none yet; otherwise hands `value` to `set`.
    fn with_value(&'static self, value: T, set: impl FnOnce(&T, T)) {
        let pending = Cell::new(Some(value));
        let r = self.with_init(
            || match pending.take() {
                Some(v) => v,
                None => (self.init)(),
            },
            |current| {
                if let Some(v) = pending.take() {
                    set(current, v);
                }
            },
        );
        if let Err(e) = r {
            panic!("{e}");
        }
    }
}

impl<T: 'static> LocalKey<Cell<T>> {
    /// Sets the value (without running the initializer if it has none yet).
    ///
    /// ```
    /// use std::cell::Cell;
    /// corewise::thread_local!(static X: Cell<u32> = Cell::new(1));
    /// X.set(3);
    /// assert_eq!(X.get(), 3);
    /// ```
    pub fn set(&'static self, value: T) {
        self.with_value(Cell::new(value), |cell, v| cell.set(v.into_inner()));
    }

    /// A copy of the value.
    ///
    /// ```
    /// use std::cell::Cell;
    /// corewise::thread_local!(static X: Cell<u32> = Cell::new(1));
    /// assert_eq!(X.get(), 1);
    /// ```
    pub fn get(&'static self) -> T
    where
        T: Copy,
    {
        self.with(Cell::get)
    }

    /// Takes the value, leaving `Default::default()`.
    ///
    /// ```
    /// use std::cell::Cell;
    /// corewise::thread_local!(static X: Cell<Option<u32>> = Cell::new(Some(1)));
    /// assert_eq!(X.take(), Some(1));
    /// assert_eq!(X.take(), None);
    /// ```
    pub fn take(&'static self) -> T
    where
        T: Default,
    {
        self.with(Cell::take)
    }

    /// Replaces the value, returning the old one.
    ///
    /// ```
    /// use std::cell::Cell;
    /// corewise::thread_local!(static X: Cell<u32> = Cell::new(1));
    /// assert_eq!(X.replace(2), 1);
    /// assert_eq!(X.get(), 2);
    /// ```
    pub fn replace(&'static self, value: T) -> T {
        self.with(|cell| cell.replace(value))
    }
}

impl<T: 'static> LocalKey<RefCell<T>> {
    /// Runs `f` on a shared borrow of the value.
    ///
    /// # Panics
    /// If the value is mutably borrowed (as `RefCell::borrow`).
    ///
    /// ```
    /// use std::cell::RefCell;
    /// corewise::thread_local!(static V: RefCell<Vec<u32>> = RefCell::new(vec![1, 2]));
    /// assert_eq!(V.with_borrow(|v| v.len()), 2);
    /// ```
    pub fn with_borrow<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        self.with(|cell| f(&cell.borrow()))
    }

    /// Runs `f` on a mutable borrow of the value.
    ///
    /// # Panics
    /// If the value is borrowed (as `RefCell::borrow_mut`).
    ///
    /// ```
    /// use std::cell::RefCell;
    /// corewise::thread_local!(static V: RefCell<Vec<u32>> = RefCell::new(Vec::new()));
    /// V.with_borrow_mut(|v| v.push(4));
    /// assert_eq!(V.with_borrow(|v| v.clone()), [4]);
    /// ```
    pub fn with_borrow_mut<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&mut T) -> R,
    {
        self.with(|cell| f(&mut cell.borrow_mut()))
    }

    /// Sets the value (without running the initializer if it has none yet).
    ///
    /// ```
    /// use std::cell::RefCell;
    /// corewise::thread_local!(static S: RefCell<String> = RefCell::new(String::new()));
    /// S.set("x".into());
    /// assert_eq!(S.with_borrow(|s| s.clone()), "x");
    /// ```
    pub fn set(&'static self, value: T) {
        self.with_value(RefCell::new(value), |cell, v| {
            *cell.borrow_mut() = v.into_inner();
        });
    }

    /// Takes the value, leaving `Default::default()`.
    ///
    /// ```
    /// use std::cell::RefCell;
    /// corewise::thread_local!(static V: RefCell<Vec<u32>> = RefCell::new(vec![1]));
    /// assert_eq!(V.take(), [1]);
    /// assert!(V.with_borrow(|v| v.is_empty()));
    /// ```
    pub fn take(&'static self) -> T
    where
        T: Default,
    {
        self.with(RefCell::take)
    }

    /// Replaces the value, returning the old one.
    ///
    /// ```
    /// use std::cell::RefCell;
    /// corewise::thread_local!(static V: RefCell<u8> = RefCell::new(1));
    /// assert_eq!(V.replace(2), 1);
    /// ```
    pub fn replace(&'static self, value: T) -> T {
        self.with(|cell| cell.replace(value))
    }
}

/// Declares per-user-thread values: `std::thread_local!`'s syntax, each
/// `static` becoming a [`LocalKey`].
///
/// Each user thread has its own value, created lazily on its first access
/// and dropped when its function returns or panics; a thread that reuses a
/// finished thread's context starts without values. On an OS thread the
/// value belongs to the OS thread.
///
/// `std::thread_local!` inside a user thread is per *kernel* thread: the
/// user threads of one core share its value, and since a user thread may
/// move to another core whenever it blocks or yields (and when cores are
/// released), the value it sees can change within one function. Use it for
/// per-core caches that tolerate that; use this macro for state that
/// belongs to the logical thread.
///
/// ```
/// use std::cell::RefCell;
/// corewise::thread_local! {
///     /// The thread's log lines.
///     static LOG: RefCell<Vec<String>> = RefCell::new(Vec::new());
///     static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
/// }
/// let rt = corewise::Runtime::new().unwrap();
/// let lines = rt.block_on(|| {
///     LOG.with_borrow_mut(|l| l.push("start".into()));
///     corewise::yield_now(); // may resume on another core: LOG follows
///     LOG.with_borrow(|l| l.len())
/// }).unwrap();
/// assert_eq!(lines, 1);
/// ```
#[macro_export]
macro_rules! thread_local {
    () => {};
    // `const { .. }` initializers are accepted for std compatibility; the
    // value is still made on first access.
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const $init:block; $($rest:tt)*) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init);
        $crate::thread_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const $init:block) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init);
        $crate::thread_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr) => {
        $(#[$attr])* $vis static $name: $crate::local::LocalKey<$t> = {
            fn __corewise_init() -> $t {
                $init
            }
            $crate::local::LocalKey::new(__corewise_init)
        };
    };
}
