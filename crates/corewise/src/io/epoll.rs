//! The epoll back end, for kernels or sandboxes without io_uring.
//!
//! Each core has its own epoll instance. A user thread first tries its call
//! non-blocking; on `EAGAIN` it waits for readiness (the fd's waiters are
//! kept per core, so a reader and a writer of one socket share one
//! registration) and blocks. The dispatcher polls the epoll set once per
//! pass while waiters exist (that is a system call per pass, the price of
//! readiness-based I/O) and sleeps in `epoll_wait` when idle.
//!
//! An fd of an I/O object that owns it for its whole life (all of
//! [`crate::net`]'s; the object's number comes along, see
//! [`super::op::Object`]) is registered once per core, edge-triggered for
//! reading and writing: a wait costs no system call, where a one-shot
//! interest costs an `epoll_ctl` per wait (6 % of the CPU time of a
//! one-core corewise-kv at 150k requests/s went there). An edge that
//! arrives while no thread waits for it (the reader is busy with the last
//! request) is kept as a ready bit, and the next wait for it returns at
//! once; a stale bit costs one `EAGAIN` retry, never a lost wakeup. The object's number tells a reused fd number
//! from the closed object it was registered for (closing an fd removes it
//! from every epoll set), so the new one is registered afresh. Other fds
//! (pipes opened through [`crate::fs`]) keep the one-shot interest.
//!
//! The idle gate's wakers only do a `futex_wake` on the gate word (see
//! [`crate::sched::idle`]); epoll cannot wait on a futex, so a small bridge thread
//! per core waits on the gate word while the core sleeps in `epoll_wait` and
//! turns the futex wake into an eventfd write (one extra thread hop per
//! wakeup of a sleeping core: the price of keeping the waker side a plain
//! futex wake).

use super::slab::Slab;
use rustix::event::epoll;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use rustix::thread::futex;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

const EVENTFD: u64 = u64::MAX;
const STOP: u32 = u32::MAX;
use crate::sched::idle::{AWAKE as GATE_AWAKE, SLEEPING as GATE_SLEEPING};

/// What [`Epoll::arm`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Armed {
    /// The waiter is recorded; the poll that sees the fd ready completes it.
    Waiting,
    /// An edge came earlier while nobody waited for it: try the call now
    /// (nothing was recorded).
    Ready,
}

/// One fd's state in one core's epoll set.
#[derive(Debug, Default)]
struct FdWaiters {
    /// The I/O object registered edge-triggered under this fd number
    /// (0: a one-shot interest, or nothing).
    ident: u64,
    /// Whether the fd is in the kernel's set.
    registered: bool,
    /// Edge-triggered: events reported while no waiter wanted them.
    ready: u32,
    /// (slab token, events wanted).
    waiters: Vec<(u64, u32)>,
}

/// Events that satisfy any waiter (the call will not block).
const ANY: u32 = epoll::EventFlags::ERR.bits() | epoll::EventFlags::HUP.bits();

/// The peer shut its side down: every read from now on returns at once
/// (data, then end of stream), so for readers this stays ready once seen.
const RDHUP: u32 = epoll::EventFlags::RDHUP.bits();

/// What, in an edge-triggered fd's kept events, satisfies a waiter for
/// `events`: those, an error or hang-up, and for a reader the peer's
/// shutdown.
fn satisfies(events: u32) -> u32 {
    let reading = epoll::EventFlags::IN.bits();
    events | ANY | if events & reading != 0 { RDHUP } else { 0 }
}

/// One core's epoll set, waiter lists and wake bridge.
pub(crate) struct Epoll {
    epfd: OwnedFd,
    eventfd: Arc<OwnedFd>,
    fds: HashMap<RawFd, FdWaiters>,
    pub(crate) slab: Slab,
    bridge: Arc<AtomicU32>,
    /// Set while the bridge waits on the `bridge` word itself.
    bridge_parked: Arc<AtomicBool>,
    bridge_thread: Option<std::thread::JoinHandle<()>>,
    gate: &'static AtomicU32,
    /// When a pass last polled and found nothing (ticks; 0: it found work).
    idle_poll_at: u64,
    /// Least time between two empty polls of a busy dispatcher.
    poll_gap: u64,
}

impl std::fmt::Debug for Epoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoll")
            .field("fds", &self.fds.len())
            .finish()
    }
}

impl Epoll {
    /// An epoll set with an eventfd for wakeups, and the bridge thread that
    /// forwards futex wakes on `gate` to it.
    pub(crate) fn new(gate: &'static AtomicU32) -> std::io::Result<Self> {
        let epfd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let eventfd = Arc::new(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?);
        epoll::add(
            &epfd,
            &*eventfd,
            epoll::EventData::new_u64(EVENTFD),
            epoll::EventFlags::IN,
        )?;
        let bridge = Arc::new(AtomicU32::new(0));
        let bridge_parked = Arc::new(AtomicBool::new(false));
        let thread = {
            let (bridge, parked, eventfd) =
                (bridge.clone(), bridge_parked.clone(), eventfd.clone());
            std::thread::Builder::new()
                .name("corewise-wake-bridge".into())
                .spawn(move || run_bridge(&bridge, &parked, gate, &eventfd))?
        };
        Ok(Self {
            epfd,
            eventfd,
            fds: HashMap::new(),
            slab: Slab::with_capacity(256),
            bridge,
            bridge_parked,
            bridge_thread: Some(thread),
            gate,
            idle_poll_at: 0,
            poll_gap: crate::clock::duration_to_ticks(Duration::from_micros(5)),
        })
    }

    /// Registers `token` as waiting for `events` (EPOLLIN/EPOLLOUT bits) on
    /// `fd`, which belongs to the I/O object numbered `ident` (0: unknown,
    /// use a one-shot interest).
    pub(crate) fn arm(
        &mut self,
        fd: RawFd,
        events: u32,
        ident: u64,
        token: u64,
    ) -> std::io::Result<Armed> {
        let entry = self.fds.entry(fd).or_default();
        if ident != 0 {
            if entry.ident != ident {
                // First wait of this object here, or the fd number now
                // belongs to another object (the old one was closed, and
                // with it its registration): register afresh.
                entry.ident = ident;
                entry.registered = false;
                entry.ready = 0;
            }
            if !entry.registered {
                register_edge(&self.epfd, fd)?;
                entry.registered = true;
            }
            if entry.ready & satisfies(events) != 0 {
                // All of it is used up, ERR and HUP too: a socket that is
                // still hung up or in error does not answer `EAGAIN`, and
                // one whose error was read (a UDP socket after an ICMP
                // error) must not be retried forever on an old edge. The
                // peer's shutdown stays: it is for good, and a read after
                // a short one waits for readiness first (see
                // `IoState::read_stream`), so end of stream must be found
                // then even when the edge that reported it also carried
                // the data that woke an earlier read.
                entry.ready &= !(events | ANY);
                return Ok(Armed::Ready);
            }
            entry.waiters.push((token, events));
            return Ok(Armed::Waiting);
        }
        if entry.ident != 0 {
            // An edge-triggered registration of an object that was closed;
            // the fd number is used without one now.
            entry.ident = 0;
            entry.ready = 0;
        }
        entry.waiters.push((token, events));
        let interest = entry.waiters.iter().fold(0, |a, w| a | w.1);
        let r = ctl(&self.epfd, fd, interest, entry.registered);
        match r {
            Ok(()) => {
                entry.registered = true;
                Ok(Armed::Waiting)
            }
            Err(e) => {
                entry.waiters.pop();
                Err(e)
            }
        }
    }

    /// Whether this pass has anything to do (one load when idle).
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.slab.pending() != 0
    }

    /// One pass: collect ready fds without waiting. After a poll that
    /// found nothing, the next waits at least `poll_gap`, so a spinning
    /// dispatcher does not turn into a loop of `epoll_wait` calls.
    pub(crate) fn pass(&mut self) -> usize {
        if !self.busy() {
            return 0;
        }
        let now = crate::clock::now();
        if self.idle_poll_at != 0 && now.wrapping_sub(self.idle_poll_at) < self.poll_gap {
            return 0;
        }
        let n = self.poll(Some(Duration::ZERO), false);
        self.idle_poll_at = if n == 0 { now } else { 0 };
        n
    }

    /// Collects ready fds (waiting up to `timeout`) and signals their
    /// waiters; `from_sleep`: the core is in its idle sleep (gate `SLEEPING`).
    fn poll(&mut self, timeout: Option<Duration>, from_sleep: bool) -> usize {
        let mut buf = [MaybeUninit::<epoll::Event>::uninit(); 256];
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: d.subsec_nanos() as _,
        });
        let Ok((events, _)) = epoll::wait(&self.epfd, &mut buf[..], ts.as_ref()) else {
            return 0;
        };
        if from_sleep {
            // Back from the idle sleep: the core is awake before it signals
            // the threads whose fds are ready (all on this core). With the
            // gate still `SLEEPING`, each of those signals would futex-wake
            // the gate, the bridge would wake (on whatever CPU it has) and
            // poke the eventfd, and the next sleep would return at once for
            // nothing: a system call and a thread hop per idle cycle. The
            // dispatcher scans for work after this anyway, which is what
            // marking the gate awake promises wakers.
            self.gate.store(GATE_AWAKE, Ordering::SeqCst);
        }
        let mut woken = 0;
        for ev in events.iter() {
            let ev = *ev;
            let (data, flags) = (ev.data, ev.flags);
            let data = data.u64();
            if data == EVENTFD {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&*self.eventfd, &mut b);
                continue;
            }
            let fd = data as RawFd;
            let revents = flags.bits();
            let Some(entry) = self.fds.get_mut(&fd) else {
                continue;
            };
            let slab = &mut self.slab;
            let mut taken = 0u32;
            entry.waiters.retain(|&(token, want)| {
                if !slab.is_pending(token) {
                    return false;
                }
                if revents & (want | ANY) == 0 {
                    return true;
                }
                if let Some(Some(t)) = slab.complete(token, revents as i32) {
                    crate::thread::signal(t);
                }
                // An error or hang-up goes to the woken thread's call.
                taken |= want | (revents & ANY);
                woken += 1;
                false
            });
            if entry.ident != 0 {
                // Edge-triggered: this edge is not reported again, so what
                // no waiter took is kept for the next wait, and the peer's
                // shutdown in any case (see `arm`).
                entry.ready |= (revents & !taken) | (revents & RDHUP);
            } else if !entry.waiters.is_empty() {
                let interest = entry.waiters.iter().fold(0, |a, w| a | w.1);
                let _ = ctl(&self.epfd, fd, interest, true);
            }
        }
        woken
    }

    /// The core is being released: wake every waiter as if its fd were
    /// ready; each tries its call again and, if it would still block,
    /// waits on the core it has moved to.
    pub(crate) fn evacuate(&mut self) {
        for t in self.slab.complete_all(0) {
            crate::thread::signal(t);
        }
        // The edge-triggered registrations go too: their objects' threads
        // wait elsewhere from now on. An fd closed meanwhile is out of the
        // set already (ENOENT/EBADF, ignored); a reused number is not in it.
        for (&fd, entry) in &self.fds {
            if entry.ident != 0 && entry.registered {
                // SAFETY: the kernel only looks the number up.
                let src = unsafe { BorrowedFd::borrow_raw(fd) };
                let _ = epoll::delete(&self.epfd, src);
            }
        }
        self.fds.clear();
    }

    /// Completes a waiter as cancelled.
    pub(crate) fn cancel(&mut self, token: u64) {
        if let Some(Some(t)) = self.slab.complete(token, -libc::ECANCELED) {
            crate::thread::signal(t);
        }
    }

    /// The idle sleep (the gate word is `SLEEPING`): in `epoll_wait`, with
    /// the bridge watching the gate word. The bridge is the only futex
    /// waiter on that word in this mode, so a waker's single `futex_wake`
    /// always reaches it (a bridge still waiting from an earlier sleep is
    /// released by the next wake and then serves the current generation).
    pub(crate) fn idle_wait(&mut self, timeout: Option<Duration>) {
        let mut armed = self.bridge.load(Ordering::Relaxed).wrapping_add(1) | 1;
        if armed == STOP {
            armed = 1;
        }
        self.bridge.store(armed, Ordering::SeqCst);
        // A bridge still waiting on the gate word from an earlier sleep
        // (the usual case: that sleep ended on an epoll event, not a wake)
        // serves this generation when released; only one waiting on the
        // bridge word needs the wake. One it misses here is about to wait
        // on the old value and returns at once.
        if self.bridge_parked.load(Ordering::SeqCst) {
            let _ = futex::wake(&self.bridge, futex::Flags::PRIVATE, 1);
        }
        self.poll(timeout, true);
        self.bridge.store(armed.wrapping_add(1), Ordering::SeqCst);
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        self.bridge.store(STOP, Ordering::SeqCst);
        let _ = futex::wake(&self.bridge, futex::Flags::PRIVATE, 1);
        let _ = futex::wake(self.gate, futex::Flags::PRIVATE, i32::MAX as u32);
        if let Some(t) = self.bridge_thread.take() {
            let _ = t.join();
        }
    }
}

fn ctl(epfd: &OwnedFd, fd: RawFd, interest: u32, registered: bool) -> std::io::Result<()> {
    let flags = epoll::EventFlags::from_bits_retain(interest)
        | epoll::EventFlags::ONESHOT
        | epoll::EventFlags::RDHUP;
    // SAFETY: the fd is open while a thread waits on it (the waiter holds
    // the object that owns it); epoll only records it.
    let src = unsafe { BorrowedFd::borrow_raw(fd) };
    let data = epoll::EventData::new_u64(fd as u64);
    let r = if registered {
        epoll::modify(epfd, src, data, flags)
    } else {
        epoll::add(epfd, src, data, flags)
    };
    match r {
        Err(rustix::io::Errno::NOENT) if registered => epoll::add(epfd, src, data, flags),
        Err(rustix::io::Errno::EXIST) if !registered => epoll::modify(epfd, src, data, flags),
        r => r,
    }
    .map_err(Into::into)
}

/// Adds `fd` for good: edge-triggered, for reading and writing.
fn register_edge(epfd: &OwnedFd, fd: RawFd) -> std::io::Result<()> {
    let flags = epoll::EventFlags::IN
        | epoll::EventFlags::OUT
        | epoll::EventFlags::RDHUP
        | epoll::EventFlags::ET;
    // SAFETY: the fd is open while a thread waits on it (the waiter holds
    // the object that owns it); epoll only records it.
    let src = unsafe { BorrowedFd::borrow_raw(fd) };
    let data = epoll::EventData::new_u64(fd as u64);
    match epoll::add(epfd, src, data, flags) {
        // Registered earlier for this fd number (a one-shot interest, or
        // a closed object's fd still open elsewhere): take it over.
        Err(rustix::io::Errno::EXIST) => epoll::modify(epfd, src, data, flags),
        r => r,
    }
    .map_err(Into::into)
}

/// The bridge: while an arming generation (odd) is current, wait on the
/// gate word; when a waker's futex wake releases it, poke the eventfd.
fn run_bridge(bridge: &AtomicU32, parked: &AtomicBool, gate: &AtomicU32, eventfd: &OwnedFd) {
    let mut served = 0u32;
    loop {
        let s = bridge.load(Ordering::SeqCst);
        if s == STOP {
            return;
        }
        if s & 1 == 0 || s == served {
            // Announced before the wait, which compares the word again: a
            // new generation stored after `s` was read ends it at once.
            parked.store(true, Ordering::SeqCst);
            let _ = futex::wait(bridge, futex::Flags::PRIVATE, s, None);
            parked.store(false, Ordering::SeqCst);
            continue;
        }
        if gate.load(Ordering::SeqCst) == GATE_SLEEPING {
            let _ = futex::wait(gate, futex::Flags::PRIVATE, GATE_SLEEPING, None);
        }
        if bridge.load(Ordering::SeqCst) == s {
            let _ = rustix::io::write(eventfd.as_fd(), &1u64.to_ne_bytes());
        }
        served = s;
    }
}
