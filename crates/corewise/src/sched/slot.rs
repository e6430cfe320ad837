//! A slot's first cache line (`Invocation`): the function of the thread
//! that will start there (inline when it fits in 40 bytes), its class and
//! generation, and the signal word. Creating a thread on another core moves
//! this one line; a signal touches it too, and the wait link of a blocked
//! thread reuses the dead closure storage.
//!
//! The core that runs a thread writes the line only while the thread
//! lives (its wait link, a park), never at its end. The generation is the
//! publication: a spawner writes the function and then bumps the
//! generation (release), and a function is live while the generation
//! differs from the last one that ran in the context, which the running
//! core keeps in the context's private part. An earlier version cleared
//! the function pointer here when the thread ended: a write by the core
//! that ran the thread into the line the spawner had just written, so one
//! more transfer of the line per thread, and the thread's exit, whose
//! locked release of its slot waits for that write, stalled on it (most of
//! the receiving core's time in cross-core creation).

use super::wakeup::SignalWord;
use crate::shim::{AtomicU32, AtomicUsize, Ordering};
use std::cell::UnsafeCell;
use std::mem::{align_of, size_of, MaybeUninit};

#[cfg(all(test, not(loom)))]
const _LINE0_IS_ONE_LINE: () = assert!(size_of::<Invocation>() == 64);

/// Bytes of a thread's function that fit in the slot's first cache line.
const INLINE_BYTES: usize = 40;

/// The first cache line of a slot: everything a spawner writes and a
/// signaller touches, so creating a thread on another core moves one
/// line (plus the core's `MaskAndCount`), and so does a signal.
#[repr(C, align(64))]
pub(crate) struct Invocation {
    /// The thread's closure, when it fits (else a `Box` pointer).
    storage: UnsafeCell<MaybeUninit<[u64; INLINE_BYTES / 8]>>,
    /// The function that runs `storage`, as a `usize` (written before the
    /// generation that publishes it).
    run: AtomicUsize,
    /// `ThreadClass` of the thread in the slot (as u32).
    pub(crate) class: AtomicU32,
    /// Bumped (release) by the spawner that puts a new thread in the slot,
    /// once its function is written: that publishes the function, and
    /// `ThreadId`s of earlier threads are recognised as stale.
    pub(crate) generation: AtomicU32,
    /// The shared half of the slot's wakeup state.
    pub(crate) signals: SignalWord,
}

impl Invocation {
    pub(crate) fn new() -> Self {
        Self {
            storage: UnsafeCell::new(MaybeUninit::uninit()),
            run: AtomicUsize::new(0),
            class: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            signals: SignalWord::new(),
        }
    }

    /// Stores `f` (inline when it fits, otherwise boxed) and publishes it
    /// by bumping the generation; returns the new generation, the
    /// thread's (read again after the publication, it may already belong
    /// to a later thread of the slot).
    ///
    /// # Safety
    /// The caller owns the slot (claimed it and has not yet made it
    /// runnable), so nothing else reads or writes `storage`.
    pub(crate) unsafe fn put<F: FnOnce() + Send + 'static>(&self, f: F) -> u32 {
        let run: unsafe fn(*mut u8) = if size_of::<F>() <= INLINE_BYTES && align_of::<F>() <= 8 {
            // SAFETY: the storage is 40 bytes aligned to 64 and F fits.
            unsafe { self.storage.get().cast::<F>().write(f) };
            run_inline::<F>
        } else {
            let boxed: Box<F> = Box::new(f);
            // SAFETY: a pointer fits in the storage.
            unsafe {
                self.storage
                    .get()
                    .cast::<*mut F>()
                    .write(Box::into_raw(boxed))
            };
            run_boxed::<F>
        };
        self.run.store(run as usize, Ordering::Relaxed);
        self.publish()
    }

    /// Publishes what the slot's owner wrote before (release): a new
    /// generation, which it returns. Only the spawner that owns the slot
    /// writes it, so no locked instruction.
    #[inline]
    pub(crate) fn publish(&self) -> u32 {
        let g = self.generation.load(Ordering::Relaxed).wrapping_add(1);
        self.generation.store(g, Ordering::Release);
        g
    }

    /// The generation to run, if one was published after `ran`, the
    /// generation whose function last ran in the context (acquire: what
    /// its spawner wrote before is visible).
    #[inline]
    pub(crate) fn to_run(&self, ran: u32) -> Option<u32> {
        let g = self.generation.load(Ordering::Acquire);
        (g != ran).then_some(g)
    }

    /// Whether a function is published in the slot (from `put` until the
    /// thread's function has returned), given `ran` (see
    /// [`to_run`](Self::to_run)). An occupied slot without one is being
    /// filled by a spawner right now.
    #[inline]
    pub(crate) fn is_published(&self, ran: u32) -> bool {
        self.to_run(ran).is_some()
    }

    /// Slot's own thread: runs the function published as generation `g`
    /// and then records `g` in `ran`.
    ///
    /// # Safety
    /// Called only by the slot's own coroutine, with `g` from
    /// [`to_run`](Self::to_run) given `ran`'s value, once.
    pub(crate) unsafe fn run_generation(&self, g: u32, ran: &AtomicU32) {
        let run = self.run.load(Ordering::Relaxed);
        // SAFETY: a new generation (acquired by `to_run`) publishes an
        // `unsafe fn(*mut u8)` and its closure, both written by `put`
        // before its release, and this runs them once (per the contract).
        unsafe {
            let run: unsafe fn(*mut u8) = std::mem::transmute::<usize, unsafe fn(*mut u8)>(run);
            run(self.storage.get().cast());
        }
        // Recorded only now: the thread is live (published) while it runs.
        ran.store(g, Ordering::Relaxed);
    }
}

impl Invocation {
    /// Puts the running thread's wait link in `storage` and returns it.
    ///
    /// The storage is dead from the moment the thread's function was
    /// taken out of it (`run_generation` moves it to the thread's stack)
    /// until the slot is freed, and a user thread waits on one queue at
    /// a time; so the link sits in the line that a signal writes and the
    /// dispatcher reads to wake the thread (see `sync::wait_queue`).
    ///
    /// # Safety
    /// Called only by the slot's running thread, while no earlier link
    /// of its is still queued.
    pub(crate) unsafe fn wait_link(
        &self,
        link: crate::sync::wait_queue::Link,
    ) -> &crate::sync::wait_queue::Link {
        const {
            assert!(size_of::<crate::sync::wait_queue::Link>() <= INLINE_BYTES);
            assert!(align_of::<crate::sync::wait_queue::Link>() <= 8);
        }
        let p = self.storage.get().cast::<crate::sync::wait_queue::Link>();
        // SAFETY: per the contract the storage holds nothing live and
        // no other thread reaches it (the old link is unlinked); it is
        // big and aligned enough (checked above).
        unsafe {
            p.write(link);
            &*p
        }
    }
}

/// # Safety
/// `p` holds an `F` written by `Invocation::put`, read exactly once.
unsafe fn run_inline<F: FnOnce()>(p: *mut u8) {
    // SAFETY: per the function's contract.
    let f = unsafe { p.cast::<F>().read() };
    f()
}

/// # Safety
/// `p` holds a `*mut F` from `Box::into_raw`, read exactly once.
unsafe fn run_boxed<F: FnOnce()>(p: *mut u8) {
    // SAFETY: per the function's contract.
    let f = unsafe { Box::from_raw(p.cast::<*mut F>().read()) };
    f()
}
