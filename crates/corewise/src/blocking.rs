//! Syscall threads: any blocking call that has no ring operation runs on a
//! pool of OS threads outside the runtime's cores while the calling user
//! thread blocks (FlexSC's syscall threads, libfibre's I/O offload).
//!
//! The pool is process-wide. Its threads are placed on the CPUs of the
//! process's affinity that no runtime core uses (all of them when that
//! leaves none, as on a 2-CPU machine where the runtime takes both). It
//! starts empty, adds a thread when a job finds none idle, up to
//! [`MAX_THREADS`], and a thread that stays idle for [`IDLE_TIMEOUT`] exits.
//! A job beyond the bound waits in the queue. The caller waits on a small
//! completion word: a user thread blocks (its core runs others), an OS
//! thread parks.

use crate::thread::ThreadId;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Upper bound on pool threads.
///
/// ```
/// use corewise::blocking::{threads, MAX_THREADS};
/// let rt = corewise::Runtime::new().unwrap();
/// // Many blocking calls at once: the pool grows, but never past the bound.
/// let hs: Vec<_> = (0..8)
///     .map(|_| rt.spawn(|| corewise::blocking(|| std::thread::sleep(std::time::Duration::from_millis(2)))).unwrap())
///     .collect();
/// for h in hs {
///     h.join().unwrap();
/// }
/// assert!(threads() >= 1 && threads() <= MAX_THREADS);
/// ```
pub const MAX_THREADS: usize = 64;
/// An idle pool thread exits after this long.
///
/// ```
/// use corewise::blocking::{threads, IDLE_TIMEOUT};
/// assert_eq!(IDLE_TIMEOUT, std::time::Duration::from_secs(5));
/// assert_eq!(corewise::blocking(|| 1), 1);
/// // The pool thread that ran it waits for more work for IDLE_TIMEOUT.
/// assert!(threads() >= 1);
/// ```
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce() + Send>;

struct Pool {
    state: Mutex<State>,
    work: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// CPUs used by runtime cores (a union over runtimes).
    excluded: u64,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(State::default()),
        work: Condvar::new(),
    })
}

/// Number of pool threads alive now (for tests and statistics).
///
/// ```
/// assert!(corewise::blocking::threads() <= corewise::blocking::MAX_THREADS);
/// ```
pub fn threads() -> usize {
    pool().state.lock().map(|s| s.threads).unwrap_or(0)
}

/// Runs `f` on a syscall thread and returns its result; the calling user
/// thread blocks meanwhile, its core runs other threads. A panic in `f` is
/// resumed in the caller. From a plain OS thread it works the same (the OS
/// thread waits).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let v = rt.block_on(|| corewise::blocking(|| {
///     std::thread::sleep(std::time::Duration::from_millis(1));
///     7
/// })).unwrap();
/// assert_eq!(v, 7);
/// ```
pub fn blocking<F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: `f` and `T` are 'static, so nothing borrowed can dangle.
    unsafe { run_scoped(f) }
}

/// Runs `f` where it cannot stall a core: on a syscall thread when called
/// from a user thread (as [`blocking`]), directly on an OS thread (which
/// has no core to stall, so the hand-off would only cost). For the
/// library's own blocking calls that have no ring operation (name lookups,
/// directory listings, `stat`); `f` may borrow from the caller.
pub(crate) fn off_core<'f, F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send + 'f,
    T: Send + 'f,
{
    if crate::thread::current().is_none() {
        return f();
    }
    // SAFETY: `run_scoped` returns only after `f` has run and been dropped,
    // so whatever `f` borrows outlives its use.
    unsafe { run_scoped(f) }
}

struct Done<T> {
    /// 0: running, 1: done.
    state: AtomicU32,
    value: Mutex<Option<std::thread::Result<T>>>,
    waiter: Waiter,
}

enum Waiter {
    User(ThreadId),
    Os(std::thread::Thread),
}

/// [`blocking`] for a closure that borrows from the caller.
///
/// # Safety
/// None beyond Rust's rules in practice: this function does not return
/// before `f` has run and been dropped, so `f`'s borrows outlive its use.
/// It is `unsafe` because that argument (a lifetime erased while the
/// caller waits) is ours to uphold, not the compiler's.
pub(crate) unsafe fn run_scoped<'f, F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send + 'f,
    T: Send + 'f,
{
    let waiter = match crate::thread::current() {
        Some(id) => Waiter::User(id),
        None => Waiter::Os(std::thread::current()),
    };
    let done: Arc<Done<T>> = Arc::new(Done {
        state: AtomicU32::new(0),
        value: Mutex::new(None),
        waiter,
    });
    let theirs = Arc::clone(&done);
    let job: Box<dyn FnOnce() + Send + 'f> = Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        *theirs.value.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        theirs.state.store(1, Ordering::Release);
        match &theirs.waiter {
            Waiter::User(id) => crate::thread::signal(*id),
            Waiter::Os(t) => t.unpark(),
        }
    });
    // SAFETY: we wait below until the job has run (state 1) and it drops
    // its captures before that store's signal; nothing outlives 'f.
    let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'f>, Job>(job) };
    submit(job);
    while done.state.load(Ordering::Acquire) == 0 {
        match &done.waiter {
            Waiter::User(_) => crate::thread::block(),
            Waiter::Os(_) => std::thread::park(),
        }
    }
    let r = done
        .value
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("the job stored its result before marking itself done");
    match r {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

fn submit(job: Job) {
    let pool = pool();
    let mut st = pool.state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(slot) = crate::sched::current::current_slot() {
        let shared = slot.core().runtime();
        for &c in shared.cpus.iter().filter(|&&c| c < 64) {
            st.excluded |= 1 << c;
        }
    }
    st.queue.push_back(job);
    if st.idle > st.queue.len().saturating_sub(1) {
        pool.work.notify_one();
        return;
    }
    if st.threads < MAX_THREADS {
        let excluded = st.excluded;
        st.threads += 1;
        let spawned = std::thread::Builder::new()
            .name("corewise-syscall".into())
            .spawn(move || worker(excluded));
        if spawned.is_err() {
            st.threads -= 1;
        }
    }
    pool.work.notify_one();
}

fn place(excluded: u64) {
    let pid = rustix::process::getpid();
    let Ok(all) = rustix::thread::sched_getaffinity(Some(pid)) else {
        return;
    };
    let mut set = rustix::thread::CpuSet::new();
    let mut any = false;
    for c in 0..rustix::thread::CpuSet::MAX_CPU {
        if all.is_set(c) && (c >= 64 || excluded & (1 << c) == 0) {
            set.set(c);
            any = true;
        }
    }
    let _ = rustix::thread::sched_setaffinity(None, if any { &set } else { &all });
}

fn worker(excluded: u64) {
    place(excluded);
    let pool = pool();
    let mut st = pool.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(job) = st.queue.pop_front() {
            drop(st);
            job();
            st = pool.state.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        st.idle += 1;
        let (g, to) = pool
            .work
            .wait_timeout(st, IDLE_TIMEOUT)
            .unwrap_or_else(|p| p.into_inner());
        st = g;
        st.idle -= 1;
        if to.timed_out() && st.queue.is_empty() {
            st.threads -= 1;
            return;
        }
    }
}
