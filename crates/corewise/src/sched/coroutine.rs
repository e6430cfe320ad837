//! Execution contexts: a guard-paged stack per slot and the switch between
//! the dispatcher and a user thread.
//!
//! corosensei does the switch (a few instructions, no system call); it stays
//! behind this small API so it can be replaced. A context gets its stack
//! (see [`crate::sched::stack`]) when it is made and keeps it for the
//! runtime's life; contexts are reused, so creating a thread never
//! allocates a stack. The slot's coroutine runs a loop: take the
//! function from the slot's first cache line, run it, free the slot, switch
//! out, and wait to be resumed for the next thread.
//!
//! A stack overflow hits the guard page below the stack. A SIGSEGV handler,
//! on the kernel thread's alternate signal stack, finds the context whose
//! guard page was hit (by address, see [`find_guard`]) and prints which user
//! thread overflowed before aborting, as std does for OS threads; faults
//! elsewhere go to the previous handler.

use crate::sched::stack::{find_guard, GiveBack, PoolStack, StackRange};
use crate::sched::ThreadContext;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

/// What the dispatcher tells a slot's coroutine when it resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Run (or continue) the slot's thread.
    Run,
    /// The runtime is shutting down: leave the slot loop.
    Exit,
}

/// The handle a running user thread uses to switch back to the dispatcher.
pub(crate) type SlotYielder = Yielder<Resume, ()>;

/// A context's coroutine and stack.
pub(crate) struct Context {
    coroutine: Coroutine<Resume, (), (), PoolStack>,
    /// The stack's extent (the coroutine owns the stack itself).
    stack: StackRange,
}

impl Context {
    /// Creates the coroutine of `slot` on a new stack of `stack_size` bytes
    /// (plus a guard page).
    pub(crate) fn new(stack_size: usize, slot: &'static ThreadContext) -> std::io::Result<Self> {
        install_overflow_handler();
        let stack = PoolStack::new(stack_size)?;
        stack.set_owner(slot);
        let range = stack.range();
        let coroutine = Coroutine::with_stack(stack, move |yielder: &SlotYielder, first| {
            slot.yielder.set(yielder as *const SlotYielder);
            let mut cmd = first;
            while cmd == Resume::Run {
                // A stale signal can make a claimed slot look runnable while
                // its spawner still writes the function (or holds the slot
                // reserved): run only what the spawner has published, and
                // enter user code only then. In user code a handoff takes
                // the running context out of its slot (see
                // `crate::sched::handoff`), and this slot is its spawner's.
                if let Some(g) = slot.to_run() {
                    crate::sched::handoff::user_code_begins(slot);
                    // SAFETY: this is the slot's own coroutine, and `g` was
                    // published and has not run.
                    unsafe { slot.run_generation(g) };
                    // Out of user code; if the core was handed over
                    // meanwhile, the thread first moves to a core (the slot
                    // it had belongs to the core's new owner).
                    crate::sched::handoff::Entry::leave_user_code(slot);
                    // The next thread on this stack starts on pages this one
                    // may have used deeply (see `give_back_stack_into`).
                    slot.stack_used.set(true);
                    crate::sched::current::exit_slot_thread(slot);
                } else {
                    #[cfg(test)]
                    stale_runs::count(slot);
                }
                slot.stack_pointer.set(stack_pointer());
                cmd = yielder.suspend(());
            }
        });
        Ok(Self {
            coroutine,
            stack: range,
        })
    }

    /// Adds to `batch` the stack's pages below `sp`, the stack pointer (or
    /// an address at most [`SP_SLACK`] above it) the suspended thread
    /// recorded when it switched out.
    ///
    /// # Safety
    /// The coroutine is suspended (not running on any kernel thread) until
    /// the batch is flushed, and `sp` was recorded by its last switch out.
    pub(crate) unsafe fn add_below(&self, sp: usize, batch: &mut GiveBack) {
        // The range ignores what lies outside the stack.
        batch.add_below(self.stack, sp.saturating_sub(SP_SLACK));
    }

    /// Runs the slot's thread until it switches out or exits.
    #[inline]
    pub(crate) fn resume(&mut self) {
        match self.coroutine.resume(Resume::Run) {
            CoroutineResult::Yield(()) => {}
            CoroutineResult::Return(()) => {}
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.coroutine.started() && !self.coroutine.done() {
            // Leave the slot loop normally so nothing needs a forced unwind.
            let _ = self.coroutine.resume(Resume::Exit);
        }
    }
}

/// Bytes below a recorded stack pointer that the switch itself may still
/// use (the frames of the suspend call and the registers it saves): the
/// pages given back start below this.
pub(crate) const SP_SLACK: usize = 2048;

/// The stack pointer of the calling code, for [`Context::add_below`].
#[inline(always)]
fn stack_pointer() -> usize {
    let sp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads a register, touches no memory.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads a register, touches no memory.
    unsafe {
        std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // An address in this frame; the switch's frames sit below it.
        let here = 0u8;
        sp = std::ptr::addr_of!(here) as usize - SP_SLACK;
    }
    sp
}

/// Switches from the running user thread back to its dispatcher. Always
/// inlined, so the switch sits at the caller's call depth (see
/// [`crate::yield_now`] for why that matters).
///
/// # Safety
/// `slot` is the slot of the calling user thread, whose coroutine set
/// `yielder` and is running now.
#[inline(always)]
pub(crate) unsafe fn switch_out(slot: &ThreadContext) {
    // SAFETY: the yielder lives on the running coroutine's stack for as long
    // as the coroutine does, and we are that coroutine (caller's contract).
    let yielder = unsafe { &*slot.yielder.get() };
    slot.stack_pointer.set(stack_pointer());
    // The dispatcher runs next on this kernel thread: no handoff until the
    // thread is back in its own code.
    let was_user = crate::sched::handoff::user_code_ends(slot);
    let _ = yielder.suspend(());
    if was_user {
        // Possibly on another kernel thread now: the dispatcher that
        // resumed the thread set `slot.kthread`.
        crate::sched::handoff::user_code_begins(slot);
    }
}

// ---- stack-overflow detection -------------------------------------------

static INSTALL: Once = Once::new();
static PREVIOUS_SEGV: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static PREVIOUS_BUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

fn install_overflow_handler() {
    INSTALL.call_once(|| {
        for (sig, prev) in [
            (libc::SIGSEGV, &PREVIOUS_SEGV),
            (libc::SIGBUS, &PREVIOUS_BUS),
        ] {
            // SAFETY: a zeroed sigaction is a valid "no handler" value; we
            // fill in handler, flags and mask before installing it, and the
            // old action is written into memory we own (leaked, static).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = overflow_handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let old: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
                if libc::sigaction(sig, &action, old) == 0 {
                    prev.store(old, Ordering::Release);
                }
            }
        }
    });
}

/// Gives the calling kernel thread an alternate signal stack if it has none,
/// so the overflow handler can run when a user-thread stack is exhausted.
pub(crate) fn ensure_signal_stack() {
    const SIZE: usize = 64 * 1024;
    // SAFETY: sigaltstack with a null new stack only reads the current one
    // into `old`; the new stack is a fresh private mapping we never unmap
    // while the thread may use it (it is leaked with the thread).
    unsafe {
        let mut old: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut old) != 0
            || old.ss_flags & libc::SS_DISABLE == 0
        {
            return;
        }
        let mem = libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if mem == libc::MAP_FAILED {
            return;
        }
        let st = libc::stack_t {
            ss_sp: mem,
            ss_flags: 0,
            ss_size: SIZE,
        };
        libc::sigaltstack(&st, std::ptr::null_mut());
    }
}

/// A `fmt::Write` into a fixed buffer: the handler must not allocate.
struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

extern "C" fn overflow_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((slot, stack_size)) = find_guard(addr) {
        let mut out = StackBuf {
            buf: [0; 512],
            len: 0,
        };
        use std::fmt::Write;
        let _ = write!(out, "\ncorewise: user thread ");
        if !slot.is_null() {
            // SAFETY: slots live as long as their runtime (leaked), and the
            // entry is cleared before a stack is freed.
            let slot = unsafe { &*slot };
            let core = slot.core();
            let _ = match slot.name() {
                Some(name) => write!(out, "'{name}' "),
                None => write!(out, "<unnamed> "),
            };
            let _ = write!(
                out,
                "(core {}, slot {}, generation {}) ",
                core.index,
                slot.index(),
                slot.generation().load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "has overflowed its stack of {} KiB; raise it with Builder::stack_size",
            stack_size / 1024
        );
        let _ = writeln!(out, "fatal runtime error: stack overflow, aborting");
        // SAFETY: write(2) and abort(3) are async-signal-safe.
        unsafe {
            libc::write(2, out.buf.as_ptr().cast(), out.len);
            libc::abort();
        }
    }
    // Not ours: hand the fault to whoever was installed before us.
    let prev = if sig == libc::SIGBUS {
        &PREVIOUS_BUS
    } else {
        &PREVIOUS_SEGV
    };
    let prev = prev.load(Ordering::Acquire);
    // SAFETY: `prev` is null or a leaked sigaction filled in by sigaction(2);
    // calling its handler with our arguments is what the kernel would have
    // done. For SIG_DFL/SIG_IGN we restore the default and return, so the
    // faulting instruction runs again and the default action applies.
    unsafe {
        if call_previous(prev, sig, info, uctx) {
            return;
        }
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

/// Calls the handler `prev` (an action saved by `sigaction`, or null) as
/// the kernel would have; returns false when there is none to call
/// (`SIG_DFL`, `SIG_IGN` or null).
///
/// # Safety
/// `prev` is null or points at an action filled in by `sigaction(2)`; the
/// other arguments are the ones the kernel passed to the calling handler.
pub(crate) unsafe fn call_previous(
    prev: *const libc::sigaction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) -> bool {
    // SAFETY: per the contract.
    let Some(prev) = (unsafe { prev.as_ref() }) else {
        return false;
    };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return false;
    }
    // SAFETY: `h` is a handler address of the kind its flags say.
    unsafe {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(sig, info, uctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
    true
}

/// Test-only: runs of a slot's coroutine that found nothing published
/// (a stale signal made the slot runnable), and how many of them found
/// their kernel thread in user code, which none may (see the coroutine's
/// loop).
#[cfg(test)]
pub(crate) mod stale_runs {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The context whose runs [`RUNS`] counts (its address; tests run in
    /// parallel, and their stale runs must not count for another's).
    pub(crate) static WATCHED: AtomicUsize = AtomicUsize::new(0);
    /// Runs of the watched context with nothing published.
    pub(crate) static RUNS: AtomicUsize = AtomicUsize::new(0);
    /// Runs with nothing published (of any context) whose kernel thread
    /// was marked in user code.
    pub(crate) static IN_USER: AtomicUsize = AtomicUsize::new(0);

    /// Counts a run of `slot` with nothing published.
    pub(crate) fn count(slot: &crate::sched::ThreadContext) {
        if crate::sched::handoff::in_user_code(slot) {
            IN_USER.fetch_add(1, Ordering::SeqCst);
        }
        if std::ptr::from_ref(slot) as usize == WATCHED.load(Ordering::SeqCst) {
            RUNS.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::stale_runs;
    use std::sync::atomic::Ordering;

    /// A stale signal to a slot that a spawner has claimed but not filled
    /// runs the slot's coroutine with nothing to run. That run must stay
    /// out of user code: a handoff there would take the context out of
    /// the slot, which is the spawner's.
    #[test]
    fn a_stale_run_of_a_claimed_slot_stays_out_of_user_code() {
        let rt = crate::Runtime::builder()
            .cpus([0])
            .neighbour_awareness(None)
            .build()
            .unwrap();
        let before = stale_runs::RUNS.load(Ordering::SeqCst);
        let ran = rt
            .block_on(move || {
                let ended = crate::spawn(|| {
                    crate::sched::current::current_slot()
                        .map(|s| s.index())
                        .unwrap()
                })
                .unwrap();
                let id = ended.thread();
                let index = ended.join().unwrap();
                // Claimed again, as a spawner does before it writes the
                // function (one core: the thread's end freed it before
                // the join returned).
                let core = crate::sched::current::current_slot().unwrap().core();
                assert_eq!(core.mask.claim_from(index), Some(index));
                assert!(!core.slot(index).is_published());
                stale_runs::WATCHED.store(
                    std::ptr::from_ref(core.slot(index)) as usize,
                    Ordering::SeqCst,
                );
                crate::thread::signal(id); // stale: its thread ended
                                           // The dispatcher runs the slot when this thread yields.
                let mut ran = false;
                for _ in 0..1_000 {
                    crate::yield_now();
                    ran = stale_runs::RUNS.load(Ordering::SeqCst) > before;
                    if ran {
                        break;
                    }
                }
                core.mask.release(index);
                ran
            })
            .unwrap();
        assert!(ran, "the stale signal ran the claimed slot's coroutine");
        assert_eq!(
            stale_runs::IN_USER.load(Ordering::SeqCst),
            0,
            "a run with nothing published entered user code"
        );
    }
}
