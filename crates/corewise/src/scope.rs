//! Scoped user threads: [`scope`] with `std::thread::scope`'s semantics.
//!
//! Why a module: scoped threads borrow from the caller's stack, so the
//! scope must not return before every thread it started has finished and
//! dropped what it borrowed. This is std's design: a scope counts its
//! threads; each thread's result cell decrements the count when it is
//! dropped (after the result, which may borrow too), and the scope's owner
//! waits for zero, blocking as a user thread (its core runs others) or
//! parking as an OS thread. A panic in a thread nobody joined is raised
//! again by `scope` when it returns (std raises a generic panic; this
//! raises the thread's own payload, so its message survives).

use crate::error::{JoinError, SpawnError};
use crate::runtime::{Runtime, Shared};
use crate::sched::current::current_slot;
use crate::sched::spawn::{spawn_job, SpawnOptions};
use crate::sync::packet::Packet;
use crate::sync::waiter::{park, Waiter};
use crate::thread::ThreadId;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Payload = Box<dyn Any + Send + 'static>;

/// The count of a scope's threads and the first panic nobody joined.
struct ScopeData {
    running: AtomicUsize,
    unjoined_panic: Mutex<Option<Payload>>,
    owner: Waiter,
}

impl ScopeData {
    fn finished(&self, panic: Option<Payload>) {
        if let Some(p) = panic {
            let mut first = self
                .unjoined_panic
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            first.get_or_insert(p);
        }
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.owner.wake();
        }
    }
}

/// A scope to spawn threads that borrow from the caller, made by [`scope`]
/// or [`Runtime::scope`].
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let mut hits = 0;
/// let words = ["a", "bb", "ccc"];
/// rt.scope(|s| {
///     let len = s.spawn(|| words.iter().map(|w| w.len()).sum::<usize>()).unwrap();
///     s.spawn(|| hits += 1).unwrap(); // a mutable borrow, ended by the scope
///     assert_eq!(len.join().unwrap(), 6);
/// });
/// assert_eq!(hits, 1);
/// ```
pub struct Scope<'scope, 'env: 'scope> {
    data: Arc<ScopeData>,
    runtime: Option<&'static Shared>,
    /// Invariance over 'scope, as in std.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("running", &self.data.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Creates a scope: threads spawned in it may borrow anything that outlives
/// it, and all of them are joined before `scope` returns.
///
/// Threads go to the runtime of the calling user thread; from an OS thread
/// use [`Runtime::scope`] (here every spawn fails with
/// [`SpawnError::NotInRuntime`]). If `f` panics, or a thread panics and
/// nobody joined it, `scope` panics with that payload once every thread has
/// ended. The caller blocks as any joiner does: a user thread's core runs
/// other threads meanwhile.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let mut data = vec![1, 2, 3];
///     let total = corewise::scope(|s| {
///         let sum = s.spawn(|| data.iter().sum::<i32>()).unwrap();
///         let len = s.spawn(|| data.len()).unwrap();
///         sum.join().unwrap() + len.join().unwrap() as i32
///     });
///     data.push(4); // the borrows ended with the scope
///     assert_eq!(total, 9);
/// })
/// .unwrap();
/// ```
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    run_scope(current_slot().map(|s| s.core().runtime()), f)
}

impl Runtime {
    /// [`scope`] whose threads go to this runtime, callable from any thread.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let words = ["core", "wise"];
    /// let lens: Vec<usize> = rt.scope(|s| {
    ///     let hs: Vec<_> = words.iter().map(|w| s.spawn(move || w.len()).unwrap()).collect();
    ///     hs.into_iter().map(|h| h.join().unwrap()).collect()
    /// });
    /// assert_eq!(lens, [4, 4]);
    /// ```
    pub fn scope<'env, F, T>(&self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        run_scope(Some(self.shared()), f)
    }
}

fn run_scope<'env, F, T>(runtime: Option<&'static Shared>, f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    let scope = Scope {
        data: Arc::new(ScopeData {
            running: AtomicUsize::new(0),
            unjoined_panic: Mutex::new(None),
            owner: Waiter::current(),
        }),
        runtime,
        scope: PhantomData,
        env: PhantomData,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&scope)));
    while scope.data.running.load(Ordering::Acquire) != 0 {
        park();
    }
    let unjoined = scope
        .data
        .unjoined_panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    match (result, unjoined) {
        (Err(p), _) | (Ok(_), Some(p)) => std::panic::resume_unwind(p),
        (Ok(r), None) => r,
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Spawns a `Normal` thread in the scope; it may borrow from outside
    /// the scope. Joining it is optional: the scope joins it anyway.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let mut counts = [0u32; 4];
    /// rt.scope(|s| {
    ///     for (i, c) in counts.iter_mut().enumerate() {
    ///         s.spawn(move || *c = i as u32 * 10).unwrap();
    ///     }
    /// });
    /// assert_eq!(counts, [0, 10, 20, 30]);
    /// ```
    pub fn spawn<F, T>(&'scope self, f: F) -> Result<ScopedJoinHandle<'scope, T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        self.spawn_with(SpawnOptions::default(), f)
    }

    pub(crate) fn spawn_with<F, T>(
        &'scope self,
        opts: SpawnOptions,
        f: F,
    ) -> Result<ScopedJoinHandle<'scope, T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let shared = self.runtime.ok_or(SpawnError::NotInRuntime)?;
        self.data.running.fetch_add(1, Ordering::Relaxed);
        let packet = Arc::new(ScopedPacket {
            scope: Arc::clone(&self.data),
            joined: AtomicBool::new(false),
            result: Packet::new(),
            _borrows: PhantomData,
        });
        let theirs = Arc::clone(&packet);
        let main = move || {
            let mut r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if let Some(p) = crate::local::exit_current() {
                if r.is_ok() {
                    r = Err(p);
                }
            }
            theirs.result.complete(r);
            // Dropping `theirs` may end the scope: nothing after this.
        };
        let main: Box<dyn FnOnce() + Send + 'scope> = Box::new(main);
        // SAFETY: the closure borrows only data that outlives 'scope, and
        // the scope does not return before the closure has run and been
        // dropped (or was dropped unrun by a failed spawn): the count
        // taken above falls only when the packet, which the closure owns
        // a reference to, is dropped. Only the lifetime changes.
        let main: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(main) };
        // On failure the closure is dropped unrun and the packet with it
        // (never completed: nothing to report).
        let id = spawn_job(shared, opts, main)?;
        Ok(ScopedJoinHandle { packet, id })
    }
}

impl crate::thread::Builder {
    /// Spawns a thread with these options in `scope` (see
    /// [`Scope::spawn`]).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let name = String::from("scoped");
    /// let n = rt.scope(|s| {
    ///     corewise::thread::Builder::new()
    ///         .name("worker")
    ///         .spawn_scoped(s, || name.len())
    ///         .unwrap()
    ///         .join()
    ///         .unwrap()
    /// });
    /// assert_eq!(n, 6);
    /// ```
    pub fn spawn_scoped<'scope, F, T>(
        self,
        scope: &'scope Scope<'scope, '_>,
        f: F,
    ) -> Result<ScopedJoinHandle<'scope, T>, SpawnError>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        scope.spawn_with(self.into_options(), f)
    }
}

/// A scoped thread's result cell: counted by its scope until dropped.
struct ScopedPacket<'scope, T> {
    scope: Arc<ScopeData>,
    joined: AtomicBool,
    result: Packet<std::thread::Result<T>>,
    _borrows: PhantomData<&'scope ()>,
}

impl<T> Drop for ScopedPacket<'_, T> {
    fn drop(&mut self) {
        // The result may borrow from the scope's environment: it goes
        // before the scope may end. A panic nobody joined goes to the scope.
        let mut panic = None;
        if !*self.joined.get_mut() && self.result.is_done() {
            if let Err(p) = self.result.wait() {
                panic = Some(p);
            }
        }
        self.scope.finished(panic);
    }
}

/// Owns a scoped thread: [`join`](Self::join) waits for it and takes its
/// result (a panic comes back as [`JoinError`]).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let data = [1, 2, 3];
/// let (sum, failed) = rt.scope(|s| {
///     let sum = s.spawn(|| data.iter().sum::<i32>()).unwrap();
///     let bad = s.spawn(|| -> i32 { panic!("no") }).unwrap();
///     (sum.join().unwrap(), bad.join().is_err()) // a joined panic is not raised again
/// });
/// assert_eq!((sum, failed), (6, true));
/// ```
pub struct ScopedJoinHandle<'scope, T> {
    packet: Arc<ScopedPacket<'scope, T>>,
    id: ThreadId,
}

impl<T> ScopedJoinHandle<'_, T> {
    /// Waits for the thread and takes its result; its panic comes back as
    /// an error (and is then not raised again by the scope).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let err = rt.scope(|s| s.spawn(|| -> u8 { panic!("inner") }).unwrap().join());
    /// assert_eq!(err.unwrap_err().message, "inner");
    /// ```
    pub fn join(self) -> Result<T, JoinError> {
        let r = self.packet.result.wait();
        self.packet.joined.store(true, Ordering::Relaxed);
        r.map_err(JoinError::from_panic)
    }

    /// Whether the thread has ended.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (tx, rx) = corewise::sync::channel::<()>(1);
    /// rt.scope(|s| {
    ///     let h = s.spawn(|| rx.recv().unwrap()).unwrap();
    ///     assert!(!h.is_finished()); // it waits for the message
    ///     tx.send(()).unwrap();
    ///     while !h.is_finished() {
    ///         std::thread::yield_now();
    ///     }
    /// });
    /// ```
    pub fn is_finished(&self) -> bool {
        self.packet.result.is_done()
    }

    /// The thread's id.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.scope(|s| {
    ///     let h = s.spawn(|| corewise::current().unwrap()).unwrap();
    ///     let id = h.thread();
    ///     assert_eq!(h.join().unwrap(), id);
    /// });
    /// ```
    pub fn thread(&self) -> ThreadId {
        self.id
    }
}

impl<T> std::fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedJoinHandle")
            .field("id", &self.id)
            .finish()
    }
}
