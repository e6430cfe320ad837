//! The io_uring back end: one ring per core, driven by the core's kernel
//! thread (FlexSC's exception-less system calls).
//!
//! User threads write SQEs into the ring of the core they run on and block;
//! the dispatcher submits everything queued in one `io_uring_enter` per pass
//! and reads completions from the CQ ring in memory, signalling the waiting
//! threads. With `DEFER_TASKRUN` + `TASKRUN_FLAG` the kernel sets a flag in
//! the shared SQ ring when it holds completions for us, so a pass enters the
//! kernel only when there is something to submit or to collect; with nothing
//! in flight a pass costs two loads.
//!
//! The idle wait is the ring's wait: an `IORING_OP_FUTEX_WAIT` on the core's
//! idle-gate word stays armed while the core sleeps, so a waker's ordinary
//! `futex_wake` on that word (see [`crate::sched::idle`]) completes it, and the same
//! `io_uring_enter` that waits for I/O also waits for wakeups and (as its
//! timeout) for the next timer.

use super::slab::{Slab, EVACUATED, GATE, IGNORE};
use io_uring::{opcode, squeue, types, IoUring};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// futex2 flags: 32-bit word, process-private (matches `FUTEX_PRIVATE_FLAG`
/// wakes from [`crate::sched::idle::IdleGate::wake`]).
const FUTEX2_SIZE_U32: u32 = 0x02;
const FUTEX2_PRIVATE: u32 = 128;
const FUTEX_BITSET_MATCH_ANY: u64 = 0xffff_ffff;

/// How to set up rings.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingOptions {
    /// SQPOLL: a kernel thread polls the SQ; `Some(cpu)` pins it.
    pub(crate) sqpoll: Option<Option<u32>>,
    /// Whichever kernel thread owns the core submits (blocking handoff, see
    /// [`crate::sched::handoff`]): neither `SINGLE_ISSUER` nor the deferred
    /// task running that needs one issuer; cooperative task running stays
    /// (a submitter blocked in an interruptible wait is still woken to run
    /// its completions' task work, one that computes runs it at its next
    /// kernel entry or timer tick).
    pub(crate) shared_issuer: bool,
}

/// One core's ring and the records of its operations.
pub(crate) struct Uring {
    ring: IoUring,
    /// CQEs still to come, the gate's futex wait excluded.
    inflight: u32,
    /// SQEs written but not yet submitted.
    queued: u32,
    gate_armed: bool,
    /// Set while [`evacuate`](Self::evacuate) runs.
    evacuating: bool,
    /// A kernel thread polls the SQ: a queued entry costs no system call.
    sqpoll: bool,
    pub(crate) slab: Slab,
    /// Setup flags that the kernel accepted, for the start-up report.
    pub(crate) setup: &'static str,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("inflight", &self.inflight)
            .field("queued", &self.queued)
            .field("setup", &self.setup)
            .finish()
    }
}

impl Uring {
    /// Creates a ring, dropping setup flags the kernel refuses one by one,
    /// and checks that it supports the futex wait the idle sleep needs.
    pub(crate) fn new(opts: RingOptions) -> std::io::Result<Self> {
        type Setup = fn(&mut io_uring::Builder);
        let full: Setup = |b| {
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag()
                .setup_coop_taskrun();
        };
        let defer: Setup = |b| {
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag();
        };
        let coop: Setup = |b| {
            b.setup_single_issuer()
                .setup_coop_taskrun()
                .setup_taskrun_flag();
        };
        let coop_only: Setup = |b| {
            b.setup_coop_taskrun().setup_taskrun_flag();
        };
        let plain: Setup = |_| {};
        let sqpoll_single: Setup = |b| {
            b.setup_single_issuer();
        };
        let attempts: &[(&'static str, Setup)] = if opts.shared_issuer {
            if opts.sqpoll.is_some() {
                &[("SQPOLL", plain)]
            } else {
                &[
                    ("COOP_TASKRUN|TASKRUN_FLAG", coop_only),
                    ("no flags", plain),
                ]
            }
        } else if opts.sqpoll.is_some() {
            &[("SQPOLL|SINGLE_ISSUER", sqpoll_single), ("SQPOLL", plain)]
        } else {
            &[
                (
                    "SINGLE_ISSUER|DEFER_TASKRUN|TASKRUN_FLAG|COOP_TASKRUN",
                    full,
                ),
                ("SINGLE_ISSUER|DEFER_TASKRUN|TASKRUN_FLAG", defer),
                ("SINGLE_ISSUER|COOP_TASKRUN|TASKRUN_FLAG", coop),
                ("COOP_TASKRUN|TASKRUN_FLAG", coop_only),
                ("no flags", plain),
            ]
        };
        let mut last = std::io::Error::from(std::io::ErrorKind::Unsupported);
        for &(name, setup) in attempts {
            let mut b = IoUring::builder();
            b.setup_cqsize(8192).setup_clamp();
            if let Some(cpu) = opts.sqpoll {
                b.setup_sqpoll(50);
                if let Some(cpu) = cpu {
                    b.setup_sqpoll_cpu(cpu);
                }
            }
            setup(&mut b);
            match b.build(1024) {
                Ok(ring) => {
                    let mut probe = io_uring::Probe::new();
                    ring.submitter().register_probe(&mut probe)?;
                    if !probe.is_supported(opcode::FutexWait::CODE)
                        || !ring.params().is_feature_ext_arg()
                    {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::Unsupported,
                            "io_uring lacks IORING_OP_FUTEX_WAIT or EXT_ARG (Linux < 6.7)",
                        ));
                    }
                    return Ok(Self {
                        ring,
                        inflight: 0,
                        queued: 0,
                        gate_armed: false,
                        evacuating: false,
                        sqpoll: opts.sqpoll.is_some(),
                        slab: Slab::with_capacity(256),
                        setup: name,
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Writes one SQE that will produce one CQE, submitting first if the SQ
    /// is full.
    ///
    /// # Safety
    /// Whatever `sqe` points to stays valid until its CQE is reaped (or, for
    /// data the kernel copies at submission, until the next submit).
    pub(crate) unsafe fn push(&mut self, sqe: &squeue::Entry) {
        loop {
            // SAFETY: per the function's contract.
            let pushed = unsafe { self.ring.submission().push(sqe) };
            if pushed.is_ok() {
                self.queued += 1;
                self.inflight += 1;
                return;
            }
            self.submit();
        }
    }

    /// Writes `first` (flagged `IO_LINK` by the caller) and `second` as one
    /// link, both published to the kernel at once: an SQPOLL thread that
    /// saw `first` alone would take the end of the queue for the end of the
    /// chain and run it without its linked timeout.
    ///
    /// # Safety
    /// As for [`push`](Self::push), for both entries.
    pub(crate) unsafe fn push_linked(&mut self, first: &squeue::Entry, second: &squeue::Entry) {
        loop {
            // SAFETY: per the function's contract.
            let pushed = unsafe {
                self.ring
                    .submission()
                    .push_multiple(&[first.clone(), second.clone()])
            };
            if pushed.is_ok() {
                self.queued += 2;
                self.inflight += 2;
                return;
            }
            self.submit();
        }
    }

    fn submit(&mut self) {
        // EBUSY/EAGAIN: completions must be reaped first; EINTR: retry later.
        match self.ring.submit() {
            Ok(_) => self.queued = self.ring.submission().len() as u32,
            Err(_) => {
                self.reap();
            }
        }
    }

    /// Whether an entry pushed now costs no system call of its own: others
    /// wait in the SQ for this pass's enter, or a kernel thread polls it.
    /// A send that would go into the ring alone is made at once instead
    /// (see [`crate::io::op::run_on`]).
    #[inline]
    pub(crate) fn batches(&self) -> bool {
        self.sqpoll || self.queued != 0
    }

    /// Whether this pass has anything to do: two loads when idle.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.queued != 0 || self.inflight != 0
    }

    /// One dispatcher pass: submit what is queued (one enter), collect what
    /// completed (from memory). Returns the number of threads signalled.
    pub(crate) fn pass(&mut self) -> usize {
        if !self.busy() {
            return 0;
        }
        if self.queued != 0 || self.ring.submission().taskrun() {
            self.submit();
        }
        self.reap()
    }

    /// Reads every available CQE, completing records and signalling waiters.
    pub(crate) fn reap(&mut self) -> usize {
        let mut woken = 0;
        let Self {
            ring,
            slab,
            inflight,
            gate_armed,
            evacuating,
            ..
        } = self;
        for cqe in ring.completion() {
            match cqe.user_data() {
                GATE => *gate_armed = false,
                IGNORE => *inflight -= 1,
                token => {
                    *inflight -= 1;
                    let mut r = cqe.result();
                    if *evacuating && cancelled_by_evacuation(r) {
                        r = EVACUATED;
                    }
                    if let Some(waiter) = slab.complete(token, r) {
                        if let Some(t) = waiter {
                            crate::thread::signal(t);
                        }
                        woken += 1;
                    }
                }
            }
        }
        woken
    }

    /// The core is being released and its threads will move: cancel every
    /// operation in flight and wait for all their completions, so nothing
    /// of this ring refers to a thread that runs elsewhere afterwards.
    /// Cancelled operations complete as [`EVACUATED`] and are submitted
    /// again by their threads on their new core.
    pub(crate) fn evacuate(&mut self) {
        if self.slab.pending() == 0 {
            return;
        }
        self.evacuating = true;
        let all = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(IGNORE);
        // SAFETY: a cancel carries no pointers.
        unsafe { self.push(&all) };
        while self.slab.pending() != 0 {
            if self.ring.submitter().submit_and_wait(1).is_ok() {
                self.queued = self.ring.submission().len() as u32;
            }
            self.reap();
        }
        self.evacuating = false;
    }

    /// The idle sleep: waits in the ring for a completion, a futex wake on
    /// `gate` (whose value is `SLEEPING` now: the caller ran
    /// `prepare_sleep` and found nothing to do), or `timeout`.
    pub(crate) fn idle_wait(&mut self, gate: &AtomicU32, timeout: Option<Duration>) {
        if !self.gate_armed {
            let sqe = opcode::FutexWait::new(
                gate.as_ptr().cast_const(),
                u64::from(crate::sched::idle::SLEEPING),
                FUTEX_BITSET_MATCH_ANY,
                FUTEX2_SIZE_U32 | FUTEX2_PRIVATE,
            )
            .build()
            .user_data(GATE);
            // SAFETY: the gate word lives in a leaked (`'static`) core.
            let pushed = unsafe { self.ring.submission().push(&sqe) };
            if pushed.is_ok() {
                self.queued += 1;
                self.gate_armed = true;
            }
        }
        let r = match timeout {
            Some(d) => {
                let ts = types::Timespec::new()
                    .sec(d.as_secs())
                    .nsec(d.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submitter().submit_and_wait(1),
        };
        // ETIME (timer), EINTR, EBUSY: look again either way.
        if r.is_ok() {
            self.queued = self.ring.submission().len() as u32;
        }
        // Back from the idle sleep: the core is awake before it signals the
        // threads whose operations completed (all of them parked or in a
        // slot here). With the gate still `SLEEPING`, the first of those
        // signals swapped it and made a futex wake for nobody (the ring's
        // armed wait took it): a system call per idle cycle, 85 % of a
        // thread-per-connection server's futex calls. The dispatcher scans
        // for work after this anyway, which is what an awake gate promises
        // wakers; the armed wait stays armed for the next sleep.
        gate.store(crate::sched::idle::AWAKE, Ordering::SeqCst);
        self.reap();
    }
}

/// Whether a completion seen while evacuating is the evacuation's cancel.
/// An operation not yet started completes with `-ECANCELED`; one that an
/// io-wq worker was running (an open waiting for a FIFO's peer) is
/// interrupted by the cancel's signal and completes with `-EINTR` or with
/// the kernel's internal restart codes (`ERESTARTSYS` and its kin, 512 to
/// 514), which io_uring passes on as they are. Either way it did nothing
/// and its thread submits it again on its new core.
fn cancelled_by_evacuation(r: i32) -> bool {
    /// `ERESTARTSYS`, `ERESTARTNOINTR`, `ERESTARTNOHAND` (linux/errno.h).
    const RESTART: std::ops::RangeInclusive<i32> = 512..=514;
    r == -libc::ECANCELED || r == -libc::EINTR || RESTART.contains(&-r)
}
